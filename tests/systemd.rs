//! The systemd units of `deploy/systemd/` checked by systemd itself: `systemd-analyze verify`
//! finds nothing wrong with `cdnmap-serve.service` or `cdnmap-dns.service` (an unknown key, a bad
//! value, a binary that is not there would each be reported), and the units agree with the
//! example configurations beside them: the credentials each loads are the token files its
//! configuration names, the state directory is the store, the configuration it starts with is
//! the example's name. The example configurations themselves are parsed and validated by the
//! config modules' tests (`api/src/config.rs`, `dns/src/config.rs`), and run here as the units
//! run them, with their tokens in credential files.
//!
//! `verify` needs the `ExecStart=` binary to exist: each unit is copied to a temporary directory
//! with `/usr/local/bin/cdnmap` replaced by the binary Cargo built for these tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use cdnmap_tests::{bin, ensure_debian_tool, workspace_root};

const UNITS: [&str; 2] = ["cdnmap-serve.service", "cdnmap-dns.service"];

fn deploy() -> PathBuf {
    workspace_root().join("deploy").join("systemd")
}

/// `systemd-analyze verify --man=no` on `unit`: (exit code, what it said).
fn verify(analyze: &Path, unit: &Path) -> (Option<i32>, String) {
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", analyze.display()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}

/// `name`'s text with the installed binary's path replaced by the one under test, written to
/// `dir` under the same name.
fn templated(dir: &Path, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(deploy().join(name))
        .unwrap_or_else(|e| panic!("read deploy/systemd/{name}: {e}"));
    assert!(
        text.contains("ExecStart=/usr/local/bin/cdnmap "),
        "{name}: ExecStart is not /usr/local/bin/cdnmap"
    );
    let built = bin!().to_str().expect("a UTF-8 binary path").to_string();
    let path = dir.join(name);
    std::fs::write(&path, text.replace("/usr/local/bin/cdnmap", &built)).expect("write the unit");
    path
}

/// Every unit passes `systemd-analyze verify` without a word; one with a key systemd does not
/// know does not (so the check above can fail).
#[test]
fn the_units_pass_systemd_analyze_verify() {
    let analyze = ensure_debian_tool("systemd-analyze", &["systemd"])
        .unwrap_or_else(|e| panic!("systemd-analyze cannot run here: {e}"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    for name in UNITS {
        let unit = templated(dir.path(), name);
        let (code, said) = verify(&analyze, &unit);
        assert_eq!(code, Some(0), "{name}:\n{said}");
        assert!(said.trim().is_empty(), "{name}:\n{said}");
    }
    let broken = templated(dir.path(), UNITS[0]);
    let text = std::fs::read_to_string(&broken).expect("read");
    std::fs::write(&broken, text.replace("NoNewPrivileges=", "NoNewPrivilege=")).expect("write");
    let (_, said) = verify(&analyze, &broken);
    assert!(
        said.contains("Unknown key") && said.contains("NoNewPrivilege"),
        "a misspelt key passed:\n{said}"
    );
}

/// The value of each `key=` line of `unit`, in order.
fn values<'u>(unit: &'u str, key: &str) -> Vec<&'u str> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect()
}

/// Each unit's credentials are the token files its example configuration names (and every
/// `/run/credentials/` path the configuration names is loaded); the serve unit's state
/// directory is its store; each starts with the example's configuration, under
/// `/etc/cdnmap/`; the DNS front end alone holds a capability, the one port 53 needs.
#[test]
fn the_units_agree_with_their_example_configurations() {
    for (name, config) in [
        ("cdnmap-serve.service", "serve.toml"),
        ("cdnmap-dns.service", "dns.toml"),
    ] {
        let unit = std::fs::read_to_string(deploy().join(name)).expect("read the unit");
        let example = std::fs::read_to_string(deploy().join(config)).expect("read the example");
        let exec = values(&unit, "ExecStart");
        assert_eq!(exec.len(), 1, "{name}");
        assert!(
            exec[0].ends_with(&format!("--config /etc/cdnmap/{config}")),
            "{name}: {}",
            exec[0]
        );
        let loaded: Vec<&str> = values(&unit, "LoadCredential")
            .into_iter()
            .map(|v| v.split(':').next().expect("a credential's name"))
            .collect();
        assert!(!loaded.is_empty(), "{name} loads no credential");
        for credential in &loaded {
            let path = format!("\"/run/credentials/{name}/{credential}\"");
            assert!(
                example.contains(&path),
                "{name} loads {credential}, which {config} does not name as {path}"
            );
        }
        let named = example.matches("/run/credentials/").count();
        assert_eq!(
            named,
            loaded.len(),
            "{config} names a credential {name} does not load"
        );
        assert!(!example.contains("_token ="), "{config} has a token inline");
        assert_eq!(
            values(&unit, "Type"),
            ["exec"],
            "{name}: no sd_notify, so Type=exec"
        );
        for hardening in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "DynamicUser=yes",
            "Restart=on-failure",
        ] {
            assert!(
                unit.lines().any(|l| l == hardening),
                "{name}: no {hardening}"
            );
        }
        assert_eq!(
            values(&unit, "LimitNOFILE").len(),
            1,
            "{name}: no LimitNOFILE"
        );
    }
    let serve = std::fs::read_to_string(deploy().join("cdnmap-serve.service")).expect("read");
    let state = values(&serve, "StateDirectory");
    assert_eq!(state, ["cdnmap-serve"]);
    let example = std::fs::read_to_string(deploy().join("serve.toml")).expect("read");
    assert!(example.contains("data_dir = \"/var/lib/cdnmap-serve\""));
    assert_eq!(values(&serve, "CapabilityBoundingSet"), [""]);
    let dns = std::fs::read_to_string(deploy().join("cdnmap-dns.service")).expect("read");
    assert_eq!(
        values(&dns, "AmbientCapabilities"),
        ["CAP_NET_BIND_SERVICE"]
    );
    assert_eq!(
        values(&dns, "CapabilityBoundingSet"),
        ["CAP_NET_BIND_SERVICE"]
    );
}

/// The address in field `field` of the first JSON log line of `log` whose message is
/// `message`, once there is one.
fn logged_addr(log: &str, message: &str, field: &str) -> Option<std::net::SocketAddr> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
        .and_then(|v| v["fields"][field].as_str()?.parse().ok())
}

/// `GET path` on `addr` until it answers 200 (at most 600 times, 100 ms apart).
fn wait_200(process: &mut cdnmap_tests::Running, addr: std::net::SocketAddr, path: &str) {
    for _ in 0..600 {
        process.assert_running();
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut answer = String::new();
            if s.write_all(request.as_bytes()).is_ok()
                && s.read_to_string(&mut answer).is_ok()
                && answer.starts_with("HTTP/1.1 200")
            {
                return;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{path} on {addr} not 200 after 60 s:\n{}", process.log());
}

/// Waits (at most 1,200 looks, 50 ms apart) until `process` logs `message` with the address
/// `field`: that address.
fn wait_logged(
    process: &mut cdnmap_tests::Running,
    message: &str,
    field: &str,
) -> std::net::SocketAddr {
    for _ in 0..1200 {
        process.assert_running();
        if let Some(addr) = logged_addr(&process.log(), message, field) {
            return addr;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!(
        "no {message:?} line with {field} in 60 s:\n{}",
        process.log()
    );
}

/// The example configurations run as the units run them (JSON logs, the tokens from credential
/// files of mode 0400): only the addresses (port 0 on loopback), the store and a small demo
/// world differ. The mapper becomes ready, and the front end, following it with its token from
/// its credential, becomes ready too.
#[test]
fn the_example_configurations_run_with_their_credentials() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let credential = |unit: &str, name: &str, text: &str| {
        let at = d.join("credentials").join(unit);
        std::fs::create_dir_all(&at).expect("mkdir");
        let path = at.join(name);
        std::fs::write(&path, text).expect("write a credential");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    };
    credential(
        "cdnmap-serve.service",
        "admin-token",
        "deploy-admin-token\n",
    );
    credential(
        "cdnmap-serve.service",
        "feedback-tokens",
        "\"dns-1\" = \"deploy-front-token\"\n",
    );
    credential(
        "cdnmap-dns.service",
        "feedback-token",
        "deploy-front-token\n",
    );
    let credentials = format!("{}/", d.join("credentials").display());
    let local = |example: &str| {
        std::fs::read_to_string(deploy().join(example))
            .expect("read the example")
            .replace("/run/credentials/", &credentials)
            .replace("0.0.0.0:50051", "127.0.0.1:0")
            .replace("0.0.0.0:8080", "127.0.0.1:0")
            .replace("0.0.0.0:53", "127.0.0.1:0")
            .replace("127.0.0.1:9153", "127.0.0.1:0")
    };
    let serve = d.join("serve.toml");
    let data = d.join("data");
    let text = local("serve.toml").replace("/var/lib/cdnmap-serve", data.to_str().expect("UTF-8"));
    std::fs::write(
        &serve,
        format!("{text}\n[demo]\nmap_units = 300\nclusters = 10\n"),
    )
    .expect("write");
    let mut mapper = cdnmap_tests::Running::cdnmap(
        bin!(),
        d,
        [
            std::ffi::OsStr::new("--log-format"),
            "json".as_ref(),
            "serve".as_ref(),
            "--config".as_ref(),
            serve.as_os_str(),
        ],
        d.join("serve.log"),
    );
    let grpc = wait_logged(&mut mapper, "listening", "grpc");
    let http = wait_logged(&mut mapper, "listening", "http");
    wait_200(&mut mapper, http, "/readyz");

    let dns = d.join("dns.toml");
    let text = local("dns.toml").replace("http://127.0.0.1:50051", &format!("http://{grpc}"));
    std::fs::write(&dns, text).expect("write");
    let mut front = cdnmap_tests::Running::cdnmap(
        bin!(),
        d,
        [
            std::ffi::OsStr::new("--log-format"),
            "json".as_ref(),
            "dns".as_ref(),
            "--config".as_ref(),
            dns.as_os_str(),
        ],
        d.join("dns.log"),
    );
    let metrics = wait_logged(&mut front, "listening", "metrics");
    wait_200(&mut front, metrics, "/readyz");
    let log = front.log();
    assert!(!log.contains("deploy-front-token"), "{log}");
    assert!(!log.contains("readable by its group"), "{log}");
    // The example gives its nameserver an address (the glue a delegation needs).
    assert!(!log.contains("without an address"), "{log}");
}
