//! Bearer tokens from a configuration key, a file or the environment, read the same way by
//! the mapper (its Admin token), the front end (its Feedback token) and the command line
//! (`record export`), so that no secret needs to be in a configuration file or on a command
//! line (where `ps` shows it).
//!
//! A token may come from one source only: two given at once is an error naming both (which
//! would win is not something an operator should have to remember). A token file is read
//! whole, less one trailing newline (`echo token > file` writes one); an empty one is refused,
//! and one its group or others may read is used with a warning (systemd's `LoadCredential=`
//! files are 0400). Every error names the key or variable and the file.

use std::path::Path;

/// A secret read, and what to warn about it (a file others may read), for the caller's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    pub value: String,
    pub warning: Option<String>,
}

/// The most bytes a token file may hold: a token is tens of bytes, a file of tokens a few
/// per front end.
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;

/// Where one token may come from, each named as the operator wrote it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sources<'a> {
    /// A configuration key and its value (`admin_token`).
    pub inline: Option<(&'a str, &'a str)>,
    /// A configuration key and the file it names (`admin_token_file`).
    pub file: Option<(&'a str, &'a Path)>,
    /// An environment variable and its value (`CDNMAP_ADMIN_TOKEN`); an empty value counts as
    /// unset.
    pub env: Option<(&'a str, &'a str)>,
}

/// The token of `sources`, if any gives one: an error when more than one does, or when the
/// file cannot be read or is empty.
pub fn token(sources: Sources<'_>) -> Result<Option<Secret>, String> {
    let env = sources.env.filter(|(_, v)| !v.is_empty());
    let given: Vec<&str> = [
        sources.inline.map(|(k, _)| k),
        sources.file.map(|(k, _)| k),
        env.map(|(k, _)| k),
    ]
    .into_iter()
    .flatten()
    .collect();
    if given.len() > 1 {
        return Err(format!(
            "the token is given by {}: keep one of them",
            given.join(" and ")
        ));
    }
    if let Some((_, value)) = sources.inline {
        return Ok(Some(Secret {
            value: value.to_string(),
            warning: None,
        }));
    }
    if let Some((_, value)) = env {
        return Ok(Some(Secret {
            value: value.to_string(),
            warning: None,
        }));
    }
    let Some((key, path)) = sources.file else {
        return Ok(None);
    };
    let read = read_file(key, path)?;
    let value = read
        .value
        .strip_suffix('\n')
        .map(|v| v.strip_suffix('\r').unwrap_or(v))
        .unwrap_or(&read.value);
    if value.is_empty() {
        return Err(format!("{key} {}: is empty", path.display()));
    }
    Ok(Some(Secret {
        value: value.to_string(),
        warning: read.warning,
    }))
}

/// The whole text of the secret file `path` (named by `key`), at most
/// [`MAX_SECRET_FILE_BYTES`], with a warning when its group or others may read it.
pub fn read_file(key: &str, path: &Path) -> Result<Secret, String> {
    let shown = || format!("{key} {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", shown()))?;
    let meta = file.metadata().map_err(|e| format!("{}: {e}", shown()))?;
    if !meta.is_file() {
        return Err(format!("{}: is not a file", shown()));
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "{}: {} bytes, more than a secret file may hold ({MAX_SECRET_FILE_BYTES})",
            shown(),
            meta.len()
        ));
    }
    let mut value = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_SECRET_FILE_BYTES),
        &mut value,
    )
    .map_err(|e| format!("{}: {e}", shown()))?;
    Ok(Secret {
        value,
        warning: loose_mode(&meta).map(|mode| {
            format!(
                "{} is readable by its group or others (mode {mode:o}): chmod 600 it, or use systemd's LoadCredential=",
                shown()
            )
        }),
    })
}

/// The file's permission bits when its group or others may read it.
#[cfg(unix)]
fn loose_mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn loose_mode(_: &std::fs::Metadata) -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        path
    }

    /// One source gives the token as it is, a file less one trailing newline (LF or CRLF);
    /// none gives none; an empty variable counts as unset.
    #[test]
    fn each_source_alone_gives_its_token() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let inline = Sources {
            inline: Some(("admin_token", "inline-token")),
            ..Sources::default()
        };
        assert_eq!(token(inline).unwrap().unwrap().value, "inline-token");
        let env = Sources {
            env: Some(("CDNMAP_ADMIN_TOKEN", "env-token")),
            ..Sources::default()
        };
        assert_eq!(token(env).unwrap().unwrap().value, "env-token");
        for (text, want) in [
            ("file-token\n", "file-token"),
            ("file-token\r\n", "file-token"),
            ("file-token", "file-token"),
            ("file-token\n\n", "file-token\n"),
        ] {
            let path = file(dir.path(), "t", text, 0o600);
            let got = token(Sources {
                file: Some(("admin_token_file", &path)),
                ..Sources::default()
            })
            .unwrap()
            .unwrap();
            assert_eq!(got.value, want, "{text:?}");
            assert_eq!(got.warning, None);
        }
        assert_eq!(token(Sources::default()), Ok(None));
        let empty_env = Sources {
            env: Some(("CDNMAP_ADMIN_TOKEN", "")),
            ..Sources::default()
        };
        assert_eq!(token(empty_env), Ok(None));
    }

    /// Two sources, a missing file and an empty one are errors naming what was given; a file
    /// others may read is used, with a warning naming it.
    #[test]
    fn two_sources_a_missing_or_empty_file_are_refused_and_a_readable_one_is_warned_of() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let good = file(dir.path(), "good", "file-token\n", 0o600);
        let both = token(Sources {
            inline: Some(("admin_token", "inline-token")),
            env: Some(("CDNMAP_ADMIN_TOKEN", "env-token")),
            ..Sources::default()
        });
        assert_eq!(
            both,
            Err(
                "the token is given by admin_token and CDNMAP_ADMIN_TOKEN: keep one of them".into()
            )
        );
        let both = token(Sources {
            file: Some(("admin_token_file", &good)),
            env: Some(("CDNMAP_ADMIN_TOKEN", "env-token")),
            ..Sources::default()
        });
        assert!(
            both.as_ref()
                .is_err_and(|e| e.contains("admin_token_file and CDNMAP_ADMIN_TOKEN")),
            "{both:?}"
        );
        let missing = dir.path().join("missing");
        let e = token(Sources {
            file: Some(("admin_token_file", &missing)),
            ..Sources::default()
        })
        .unwrap_err();
        assert!(
            e.starts_with(&format!("admin_token_file {}: ", missing.display())),
            "{e}"
        );
        for text in ["", "\n"] {
            let empty = file(dir.path(), "empty", text, 0o600);
            assert_eq!(
                token(Sources {
                    file: Some(("admin_token_file", &empty)),
                    ..Sources::default()
                }),
                Err(format!("admin_token_file {}: is empty", empty.display()))
            );
        }
        #[cfg(unix)]
        {
            let open = file(dir.path(), "open", "file-token\n", 0o644);
            let got = token(Sources {
                file: Some(("admin_token_file", &open)),
                ..Sources::default()
            })
            .unwrap()
            .unwrap();
            assert_eq!(got.value, "file-token");
            let warning = got.warning.expect("a warning");
            assert!(
                warning.contains(&open.display().to_string()) && warning.contains("644"),
                "{warning}"
            );
        }
    }
}
