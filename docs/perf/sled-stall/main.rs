use std::time::Instant;
fn val(mb: usize, seed: usize) -> Vec<u8> { (0..mb << 20).map(|i| (i * 7 + seed) as u8).collect() }
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let big: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(500);
    let db = sled::open(&dir).unwrap();
    let t = db.open_tree("served").unwrap();
    let s = Instant::now();
    let mut b = sled::Batch::default();
    b.insert(b"base".to_vec(), val(big, 1));
    b.insert(b"map/0".to_vec(), val(11, 0));
    t.apply_batch(b).unwrap(); db.flush().unwrap();
    println!("round 0: {:?}", s.elapsed());
    for r in 1..20usize {
        let s = Instant::now();
        let mut b = sled::Batch::default();
        b.insert(format!("map/{r:04}").into_bytes(), val(11, r));
        b.insert(format!("round/{r:04}").into_bytes(), val(8, r));
        t.apply_batch(b).unwrap();
        let a = s.elapsed();
        if r > 4 { t.remove(format!("map/{:04}", r - 4).into_bytes()).unwrap(); }
        db.flush().unwrap();
        let f = s.elapsed();
        let mut c = std::time::Duration::ZERO;
        if r == 1 || r == 10 {
            let s2 = Instant::now();
            t.insert(b"estimator", val(235, r)).unwrap(); db.flush().unwrap();
            c = s2.elapsed();
        }
        println!("round {r}: batch {a:?} total {f:?} checkpoint {c:?}");
    }
}
