//! The signature cache: a signature is made once per distinct RRset, key and validity window,
//! not per query. An entry is found by what the signature covers (the RRSIG's fields, with the
//! key tag, algorithm and window, then the RRset in canonical form: owner, type, class, TTL,
//! RDATA), through its fingerprint: 128 bits of SipHash-2-4 keyed with a random secret of the
//! process. The names answered come from clients, but without the secret no one can make two
//! contents with one fingerprint, and by chance two of them share one with a probability of
//! about n²/2¹²⁹ for n contents ever cached: nil. So an entry is 16 bytes of key and the
//! 64-byte signature inline (both algorithms' signatures are 64 bytes), a hit one hash pass
//! over the content, one probe and no pointer to follow.
//!
//! Bounded: a fixed number of entries over 16 shards, each shard two generations (a young map
//! filled until it holds half the shard's share, then made the old one, the old one dropped;
//! a hit in the old generation moves the entry to the young one). So it holds at most its
//! capacity, keeps what is used, and evicts in O(1). A window's entries age out once the
//! window moves (`sign::Validity::window`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use siphasher::sip128::{Hasher128, SipHasher24};

const SHARDS: usize = 16;

/// The smallest and largest capacities (`dnssec_cache_entries`).
pub const CACHE_ENTRIES: std::ops::RangeInclusive<usize> = 64..=16_777_216;

/// A signature's length: ECDSA P-256 (r‖s) and Ed25519 alike.
pub const SIGNATURE_LEN: usize = 64;

/// A signature, as an RRSIG ends with it.
pub type Signature = [u8; SIGNATURE_LEN];

/// The maps' hasher: a fingerprint is random already, so its low 64 bits are the hash (the
/// shard is picked by the high ones).
#[derive(Default)]
struct Low64(u64);

impl Hasher for Low64 {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u128` keys are hashed here; any other input still hashes, folded in.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type Generation = HashMap<u128, Signature, BuildHasherDefault<Low64>>;

#[derive(Default)]
struct Shard {
    young: Generation,
    old: Generation,
}

pub struct SignatureCache {
    shards: Box<[Mutex<Shard>]>,
    /// The fingerprints' secret.
    keys: (u64, u64),
    /// Entries of a generation (half a shard's share).
    generation: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_counter: metrics::Counter,
    miss_counter: metrics::Counter,
}

impl SignatureCache {
    /// A cache of at most `entries` signatures (clamped to [`CACHE_ENTRIES`]).
    pub fn new(entries: usize) -> SignatureCache {
        let entries = entries.clamp(*CACHE_ENTRIES.start(), *CACHE_ENTRIES.end());
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        let counter = |cache: &'static str| metrics::counter!("cdnmap_dns_dnssec_signatures_total", "cache" => cache);
        let (hit_counter, miss_counter) = (counter("hit"), counter("miss"));
        hit_counter.increment(0);
        miss_counter.increment(0);
        SignatureCache {
            shards,
            keys: rand::random(),
            generation: (entries / SHARDS / 2).max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hit_counter,
            miss_counter,
        }
    }

    /// The fingerprint of `signed` (module docs).
    fn fingerprint(&self, signed: &[u8]) -> u128 {
        let mut h = SipHasher24::new_with_keys(self.keys.0, self.keys.1);
        h.write(signed);
        h.finish128().as_u128()
    }

    /// The signature of `signed` (what it covers), from the cache or made by `sign` (outside
    /// the shard's lock) and kept. `None` when `sign` fails or makes a signature of another
    /// length than [`SIGNATURE_LEN`].
    pub fn get_or_sign(
        &self,
        signed: &[u8],
        sign: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Option<Signature> {
        let fingerprint = self.fingerprint(signed);
        let shard = &self.shards[((fingerprint >> 64) as usize) % SHARDS];
        if let Some(found) = self.lookup(shard, fingerprint) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.hit_counter.increment(1);
            return Some(found);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.miss_counter.increment(1);
        let signature: Signature = sign()?.try_into().ok()?;
        if let Ok(mut s) = shard.lock() {
            self.insert(&mut s, fingerprint, signature);
        }
        Some(signature)
    }

    fn lookup(&self, shard: &Mutex<Shard>, fingerprint: u128) -> Option<Signature> {
        let mut s = shard.lock().ok()?;
        if let Some(sig) = s.young.get(&fingerprint) {
            return Some(*sig);
        }
        let sig = s.old.remove(&fingerprint)?;
        self.insert(&mut s, fingerprint, sig);
        Some(sig)
    }

    fn insert(&self, s: &mut Shard, fingerprint: u128, sig: Signature) {
        if s.young.len() >= self.generation {
            s.old = std::mem::take(&mut s.young);
        }
        s.young.insert(fingerprint, sig);
    }

    /// Drops every entry (new keys: a key of the same tag and algorithm as one before must
    /// not be answered with the old one's signatures).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            if let Ok(mut s) = shard.lock() {
                s.young.clear();
                s.old.clear();
            }
        }
    }

    /// Signatures found and made so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.young.len() + s.old.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.generation * 2 * SHARDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature is made once per content; the cache never holds more than its capacity, and
    /// an entry used often survives a flood of others.
    #[test]
    fn signs_once_per_content_and_stays_bounded() {
        let cache = SignatureCache::new(1024);
        let made = std::cell::Cell::new(0);
        // A "signature" of 64 bytes: the content's bytes reversed, then zeros.
        let signature = |b: &[u8]| {
            let mut sig = [0u8; SIGNATURE_LEN];
            for (s, c) in sig.iter_mut().zip(b.iter().rev()) {
                *s = *c;
            }
            sig
        };
        let sign = |b: &[u8]| {
            made.set(made.get() + 1);
            Some(signature(b).to_vec())
        };
        let hot = b"hot rrset".to_vec();
        for i in 0..20_000u32 {
            let cold = i.to_be_bytes();
            assert_eq!(
                cache.get_or_sign(&cold, || sign(&cold)),
                Some(signature(&cold))
            );
            assert_eq!(
                cache
                    .get_or_sign(&hot, || sign(&hot))
                    .map(|s| s[..9].to_vec()),
                Some(b"tesrr toh".to_vec())
            );
            assert!(cache.len() <= cache.capacity(), "bounded");
        }
        assert_eq!(cache.capacity(), 1024);
        assert_eq!(made.get(), 20_001, "the hot RRset signed once");
        assert_eq!(cache.stats(), (19_999, 20_001));
        assert_eq!(
            cache.get_or_sign(b"x", || None),
            None,
            "a failed signature is not kept"
        );
        assert_eq!(
            cache.get_or_sign(b"x", || Some(vec![1; 63])),
            None,
            "nor one of another length"
        );
        assert_eq!(cache.get_or_sign(b"x", || Some(vec![1; 64])), Some([1; 64]));
        assert_eq!(cache.get_or_sign(b"x", || None), Some([1; 64]), "found");
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.get_or_sign(b"x", || Some(vec![2; 64])), Some([2; 64]));
    }
}
