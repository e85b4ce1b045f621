//! What a report says about the code that wrote it (embedded by build.rs) and the directory it
//! ran in.

/// relattn's own git revision at build time; None when built outside a git checkout.
pub fn relattn_revision() -> Option<String> {
    option_env!("RELATTN_REVISION").map(str::to_string)
}

/// The build: version, short revision (`+modified` when the checkout had uncommitted
/// changes), profile and target, e.g. `0.1.0 419eb80c1a2b release x86_64-unknown-linux-gnu`.
pub fn relattn_build() -> String {
    env!("RELATTN_BUILD").to_string()
}

/// The git revision of the working directory's checkout (the repository the command runs in,
/// which may be a serving engine's), from `RELATTN_GIT_REV` or `git rev-parse HEAD`; None
/// outside a checkout.
pub fn workdir_revision() -> Option<String> {
    if let Ok(rev) = std::env::var("RELATTN_GIT_REV") {
        return Some(rev);
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_and_revision_are_embedded() {
        let build = relattn_build();
        assert!(build.starts_with(env!("CARGO_PKG_VERSION")), "{build}");
        if let Some(rev) = relattn_revision() {
            assert_eq!(rev.len(), 40, "{rev}");
            assert!(rev.bytes().all(|b| b.is_ascii_hexdigit()), "{rev}");
            assert!(build.contains(&rev[..12]), "{build}");
        } else {
            assert!(build.contains("no-git"), "{build}");
        }
    }
}
