//! DNSSEC online signing end to end (issue 44, item 4), against BIND's own tools (Debian's
//! bind9-utils and bind9-dnsutils, installed when missing):
//!
//! - keys made by `dnssec-keygen` (ECDSAP256SHA256 and ED25519, KSK and ZSK) load, and
//!   `cdnmap dns ds` prints the DS records `dnssec-dsfromkey -2` prints for them;
//! - `delv`, trusting the zone's key-signing key, validates the front end's signed answers
//!   (A, AAAA, NXDOMAIN by compact denial, NODATA, the SOA) as "fully validated";
//! - unbound, validating with the zone's DS and sending ECS, sets AD on the answers;
//! - a key rollover through SIGHUP publishes the next key before it signs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use cdnmap_proto::v1 as pb;
use cdnmap_tests::bin;
use cdnmap_tests::dns::{client_of, dig, free_port, Dns, DnsPeer, Reply};
use cdnmap_tests::mapper::{all_units, qname_of, Setup};

/// A BIND tool, installed from Debian's `package` when missing.
fn tool(program: &str, package: &str) -> PathBuf {
    cdnmap_tests::ensure_debian_tool(program, &[package])
        .unwrap_or_else(|e| panic!("{program} cannot run here: {e}"))
}

/// Runs `program` with `args`; its standard output (it must succeed).
fn output(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes a key of `zone` with `dnssec-keygen -a <alg>` (a KSK when `ksk`) in `dir`; its base
/// path.
fn keygen(dir: &Path, zone: &str, alg: &str, ksk: bool, extra: &[&str]) -> PathBuf {
    let keygen = tool("dnssec-keygen", "bind9-utils");
    let dir_s = dir.to_str().expect("a UTF-8 path");
    let mut args = vec!["-q", "-K", dir_s, "-a", alg];
    if ksk {
        args.extend(["-f", "KSK"]);
    }
    args.extend_from_slice(extra);
    args.push(zone);
    let base = output(&keygen, &args);
    dir.join(base.trim())
}

/// `dnssec-keygen`'s keys load (the tag in the file name is the one computed), and `cdnmap dns
/// ds` prints what `dnssec-dsfromkey -2` prints: of each key given, and of the configuration's
/// key-signing keys only.
#[test]
fn ds_records_are_dnssec_dsfromkeys() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let keys = [
        keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", true, &[]),
        keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", false, &[]),
        keygen(dir.path(), "cdn.example", "ED25519", true, &[]),
        keygen(dir.path(), "cdn.example", "ED25519", false, &[]),
    ];
    let dsfromkey = tool("dnssec-dsfromkey", "bind9-utils");
    let theirs: Vec<String> = keys
        .iter()
        .map(|k| {
            let key_file = format!("{}.key", k.display());
            output(&dsfromkey, &["-2", &key_file]).trim().to_string()
        })
        .collect();
    let paths: Vec<&str> = keys.iter().map(|k| k.to_str().expect("UTF-8")).collect();
    let mut args = vec!["dns", "ds"];
    args.extend(&paths);
    let ours = output(bin!(), &args);
    let ours: Vec<&str> = ours.lines().collect();
    assert_eq!(ours, theirs);

    let config = dir.path().join("dns.toml");
    let listed: Vec<String> = paths.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        &config,
        format!(
            "zones = [\"cdn.example.\"]\ndnssec_keys = [{}]\n",
            listed.join(", ")
        ),
    )
    .expect("write the configuration");
    let ours = output(
        bin!(),
        &["dns", "ds", "--config", config.to_str().expect("UTF-8")],
    );
    let ours: Vec<&str> = ours.lines().collect();
    assert_eq!(ours, [theirs[0].as_str(), theirs[2].as_str()], "the KSKs'");
}

/// The zone's trust anchor for `delv -a` and unbound: the DS of `ksk` (from `cdnmap dns ds`),
/// as BIND's `trust-anchors` statement; and the DS line itself.
fn anchor(dir: &Path, ksk: &Path) -> (PathBuf, String) {
    let ds = output(bin!(), &["dns", "ds", ksk.to_str().expect("UTF-8")]);
    let ds = ds.trim().to_string();
    let f: Vec<&str> = ds.split_whitespace().collect();
    assert_eq!(f[..3], ["cdn.example.", "IN", "DS"], "{ds}");
    let file = dir.join(format!("anchor-{}.conf", f[3]));
    std::fs::write(
        &file,
        format!(
            "trust-anchors {{ cdn.example. static-ds {} {} {} \"{}\"; }};\n",
            f[3], f[4], f[5], f[6]
        ),
    )
    .expect("write the anchor");
    (file, ds)
}

/// `delv` at `addr`, trusting `anchor` for `cdn.example`: its output.
fn delv(addr: SocketAddr, anchor: &Path, name: &str, qtype: &str) -> String {
    let delv = tool("delv", "bind9-dnsutils");
    let port = addr.port().to_string();
    let server = format!("@{}", addr.ip());
    let out = Command::new(delv)
        .args([&server, "-p", &port, "-a"])
        .arg(anchor)
        .args(["+root=cdn.example", "+tcp", name, qtype])
        .output()
        .expect("delv runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A front end signing `cdn.example.` with `keys` (base paths), with the glue of
/// `ns1.cdn.example.` and a TXT record at the apex, following `mapper`.
fn signing_front_end(dir: &Path, mapper: SocketAddr, keys: &[&Path]) -> Dns {
    let listed: Vec<String> = keys
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let config = format!(
        "dnssec_keys = [{}]\n\n[[records]]\nname = \"ns1\"\ntype = \"A\"\ndata = \"192.0.2.53\"\n\n\
         [[records]]\nname = \"@\"\ntype = \"TXT\"\ndata = \"v=spf1 -all\"\n\n\
         [[services]]\nname = \"*.cdn.example.\"\ndata = \"1 . alpn=h3,h2\"\n",
        listed.join(", ")
    );
    let mut dns = Dns::start(bin!(), dir, mapper, &config);
    dns.wait_answering();
    dns
}

/// `delv`, trusting only the DS of the zone's KSK, validates the front end's answers: the
/// map's A, AAAA (an answer or NODATA, as the map has it), a name that does not exist
/// (compact denial: NOERROR with an NSEC of NXNAME), NODATA, the SOA, the glue, the TXT at
/// the apex, the HTTPS binding (its hints the map's) and the DNSKEY RRset; for a KSK+ZSK pair of ECDSA P-256, an Ed25519 CSK, and
/// both algorithms at once (where a denial too large for 512 bytes is truncated).
/// With a DS of another key, it fails: the validation is real.
#[tokio::test(flavor = "multi_thread")]
async fn delv_validates_signed_answers() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ecdsa_ksk = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", true, &[]);
    let ecdsa_zsk = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", false, &[]);
    let ed_csk = keygen(dir.path(), "cdn.example", "ED25519", true, &[]);
    let stranger = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", true, &[]);
    let positive = "; fully validated";
    let negative = "; negative response, fully validated";
    for keys in [
        vec![ecdsa_ksk.as_path(), ecdsa_zsk.as_path()],
        vec![ed_csk.as_path()],
        vec![ecdsa_ksk.as_path(), ed_csk.as_path()],
    ] {
        let dns = signing_front_end(dir.path(), server.grpc, &keys);
        let (trusted, _) = anchor(dir.path(), keys[0]);
        for (name, qtype, want) in [
            ("www.cdn.example", "A", &[positive][..]),
            ("x.video.cdn.example", "AAAA", &[positive, negative][..]),
            ("x.video.cdn.example", "A", &[positive][..]),
            ("x.video.cdn.example", "TXT", &[negative][..]),
            ("api.apps.cdn.example", "A", &[positive][..]),
            ("nothing-here.cdn.example", "A", &[negative][..]),
            ("www.cdn.example", "TXT", &[negative][..]),
            ("www.cdn.example", "HTTPS", &[positive][..]),
            ("www.cdn.example", "SVCB", &[negative][..]),
            ("cdn.example", "MX", &[negative][..]),
            ("cdn.example", "SOA", &[positive][..]),
            ("cdn.example", "TXT", &[positive][..]),
            ("ns1.cdn.example", "A", &[positive][..]),
            ("cdn.example", "DNSKEY", &[positive][..]),
        ] {
            let out = delv(dns.addr, &trusted, name, qtype);
            assert!(
                want.iter().any(|w| out.lines().any(|l| l.trim() == *w)),
                "{keys:?}: delv {name} {qtype}: wanted {want:?}:\n{out}\n{}",
                dns.log()
            );
        }
        // A wildcard's answer is signed as the wildcard's RRset (Labels 3:
        // `*.video.cdn.example`), with the NSEC that shows the name itself is not there; the
        // same over UDP (the fast path) and TCP (hickory's).
        for transport in ["+notcp", "+tcp"] {
            let r = dns.dig(&[transport, "x.video.cdn.example", "A", "+dnssec"]);
            let labels: Vec<&str> = r
                .answers
                .iter()
                .filter(|a| a.2 == "RRSIG")
                .filter_map(|a| a.3.split_whitespace().nth(2))
                .collect();
            assert!(
                !labels.is_empty() && labels.iter().all(|l| *l == "3"),
                "{transport}: {}",
                r.raw
            );
            assert!(
                r.authority.iter().any(|a| a.2 == "NSEC"
                    && a.0 == "w\\255.video.cdn.example."
                    && a.3.starts_with("x\\000.video.cdn.example. RRSIG NSEC")),
                "{transport}: {}",
                r.raw
            );
        }
        if keys.len() == 2 && keys[1] == ed_csk.as_path() {
            // Two algorithms: a denial with two RRSIGs an RRset is larger than 512 bytes, so
            // it is truncated for a 512-byte buffer, and whole over TCP.
            let small = ["nothing-here.cdn.example", "A", "+dnssec", "+bufsize=512"];
            let cut = dns.dig(&[&small[..], &["+ignore"]].concat());
            assert!(cut.flags.iter().any(|f| f == "tc"), "{}", cut.raw);
            let whole = dns.dig(&small);
            assert!(!whole.flags.iter().any(|f| f == "tc"), "{}", whole.raw);
            let sigs = whole.authority.iter().filter(|r| r.2 == "RRSIG").count();
            assert_eq!(sigs, 4, "SOA and NSEC, by each algorithm: {}", whole.raw);
        }
        let (wrong, _) = anchor(dir.path(), &stranger);
        let out = delv(dns.addr, &wrong, "www.cdn.example", "A");
        assert!(
            !out.contains("fully validated") && out.contains("resolution failed"),
            "{out}"
        );
    }
}

/// The key tags of the RRSIGs covering `covered` in `reply`'s answer section.
fn rrsig_tags(reply: &Reply, covered: &str) -> Vec<String> {
    reply
        .answers
        .iter()
        .filter(|a| a.2 == "RRSIG" && a.3.split_whitespace().next() == Some(covered))
        .filter_map(|a| a.3.split_whitespace().nth(6).map(str::to_string))
        .collect()
}

/// A key rollover through SIGHUP: a key made to be active tomorrow, added to `dnssec_keys`, is
/// published in the DNSKEY RRset at once and signs nothing yet (the old key keeps signing, and
/// `delv` keeps validating with the old DS); a key set that does not load keeps the one in
/// use, and the log says why.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_publishes_the_next_key_before_it_signs() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let old = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", true, &[]);
    let next = keygen(
        dir.path(),
        "cdn.example",
        "ECDSAP256SHA256",
        true,
        &["-P", "now", "-A", "+1d"],
    );
    let tag = |p: &Path| -> String {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        name.rsplit('+')
            .next()
            .unwrap_or_default()
            .trim_start_matches('0')
            .to_string()
    };
    let mut dns = signing_front_end(dir.path(), server.grpc, &[&old]);
    let (trusted, _) = anchor(dir.path(), &old);
    let dnskey = |dns: &Dns| dns.dig(&["cdn.example", "DNSKEY", "+dnssec", "+tcp"]);
    let keys = dnskey(&dns);
    assert_eq!(
        keys.answers.iter().filter(|a| a.2 == "DNSKEY").count(),
        1,
        "{}",
        keys.raw
    );
    assert_eq!(rrsig_tags(&keys, "DNSKEY"), [tag(&old)]);

    let config = std::fs::read_to_string(&dns.config).expect("the config");
    let both = config.replacen(
        "dnssec_keys = [",
        &format!("dnssec_keys = [{:?}, ", next.display().to_string()),
        1,
    );
    std::fs::write(&dns.config, &both).expect("rewrite the config");
    dns.process.send_signal("HUP");
    dns.wait_logged("SIGHUP: the zone data reloaded", 1);
    let keys = dnskey(&dns);
    assert_eq!(
        keys.answers.iter().filter(|a| a.2 == "DNSKEY").count(),
        2,
        "{}",
        keys.raw
    );
    assert_eq!(
        rrsig_tags(&keys, "DNSKEY"),
        [tag(&old)],
        "the next key signs nothing yet"
    );
    let a = dns.dig(&["www.cdn.example", "A", "+dnssec"]);
    assert_eq!(rrsig_tags(&a, "A"), [tag(&old)], "{}", a.raw);
    let out = delv(dns.addr, &trusted, "www.cdn.example", "A");
    assert!(
        out.lines().any(|l| l.trim() == "; fully validated"),
        "{out}"
    );

    let broken = both.replacen("dnssec_keys = [", "dnssec_keys = [\"/nonexistent/Kx\", ", 1);
    std::fs::write(&dns.config, broken).expect("rewrite the config");
    dns.process.send_signal("HUP");
    dns.wait_logged("the one in use is kept", 1);
    assert!(
        dns.log()
            .contains("dnssec_keys[0]: /nonexistent/Kx.key: cannot be read"),
        "{}",
        dns.log()
    );
    let keys = dnskey(&dns);
    assert_eq!(
        keys.answers.iter().filter(|a| a.2 == "DNSKEY").count(),
        2,
        "{}",
        keys.raw
    );
}

/// Debian's unbound (unpacked) on loopback validating `cdn.example.` (a stub zone at
/// `front_end`) with the trust anchor `ds` (a DS line), sending the client's subnet (ECS).
fn validating_unbound(dir: &Path, front_end: SocketAddr, ds: &str) -> DnsPeer {
    let program = cdnmap_tests::unpacked_debian_program("unbound", "usr/sbin/unbound")
        .unwrap_or_else(|e| panic!("unbound cannot run here: {e}"));
    let port = free_port();
    let conf = dir.join("unbound.conf");
    let text = format!(
        "server:\n  interface: 127.0.0.1\n  port: {port}\n  do-daemonize: no\n  \
         username: \"\"\n  chroot: \"\"\n  directory: {dir:?}\n  pidfile: \"\"\n  \
         use-syslog: no\n  logfile: \"\"\n  verbosity: 1\n  do-not-query-localhost: no\n  \
         module-config: \"subnetcache validator iterator\"\n  send-client-subnet: {ip}\n  \
         client-subnet-zone: cdn.example\n  client-subnet-always-forward: yes\n  \
         max-client-subnet-ipv4: 24\n  max-client-subnet-ipv6: 56\n  \
         access-control: 127.0.0.0/8 allow\n  qname-minimisation: no\n  \
         trust-anchor: \"{ds}\"\n\
         stub-zone:\n  name: \"cdn.example\"\n  stub-addr: {ip}@{front_port}\n",
        ip = front_end.ip(),
        front_port = front_end.port(),
    );
    std::fs::write(&conf, text).expect("write unbound.conf");
    let mut cmd = Command::new(&program);
    cmd.arg("-c").arg(&conf);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    DnsPeer::start(
        "unbound",
        cmd,
        dir.join("unbound.log"),
        addr,
        // Checking disabled: answered whether the anchor holds or not.
        &["cdn.example", "SOA", "+cd", "+tries=1", "+time=1"],
    )
}

/// Through unbound validating with the zone's DS and sending ECS: answers of map units of
/// several subnets (each its own ECS-scoped, signed answer), a name that does not exist and
/// NODATA come back with AD set; with the DS of another key, SERVFAIL.
#[tokio::test(flavor = "multi_thread")]
async fn unbound_sets_ad_on_answers_with_ecs() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ksk = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", true, &[]);
    let zsk = keygen(dir.path(), "cdn.example", "ECDSAP256SHA256", false, &[]);
    let dns = signing_front_end(dir.path(), server.grpc, &[&ksk, &zsk]);
    let (_, ds) = anchor(dir.path(), &ksk);
    let unbound = validating_unbound(dir.path(), dns.addr, &ds);

    let units = all_units(&server).await;
    let sample: Vec<&pb::MapUnit> = units
        .iter()
        .filter(|u| !u.prefixes.is_empty())
        .step_by(units.len() / 20 + 1)
        .collect();
    let mut signed = 0;
    for u in &sample {
        let (subnet, _, name) = client_of(u);
        let qname = qname_of(&u.traffic_class);
        let got = dig(
            unbound.addr,
            &[qname, name, &format!("+subnet={subnet}"), "+dnssec"],
        );
        assert_eq!(got.status, "NOERROR", "{}\n{}", got.raw, unbound.log());
        assert!(
            got.flags.iter().any(|f| f == "ad"),
            "unit {}: no AD:\n{}",
            u.id,
            got.raw
        );
        if !got.addresses().is_empty() {
            signed += 1;
        }
    }
    assert!(signed >= 10, "only {signed} answers with addresses");
    for (name, qtype) in [
        ("nothing-here.cdn.example", "A"),
        ("www.cdn.example", "TXT"),
        ("edge7.video.cdn.example", "TXT"),
    ] {
        let got = dig(
            unbound.addr,
            &[name, qtype, "+subnet=192.0.2.0/24", "+dnssec"],
        );
        assert!(
            got.flags.iter().any(|f| f == "ad"),
            "{name} {qtype}: no AD:\n{}",
            got.raw
        );
    }
    let (_, other) = anchor(
        dir.path(),
        &keygen(dir.path(), "cdn.example", "ED25519", true, &[]),
    );
    let dir2 = tempfile::tempdir().expect("a temporary directory");
    let wrong = validating_unbound(dir2.path(), dns.addr, &other);
    let got = dig(
        wrong.addr,
        &["www.cdn.example", "A", "+subnet=192.0.2.0/24"],
    );
    assert_eq!(got.status, "SERVFAIL", "{}", got.raw);
}
