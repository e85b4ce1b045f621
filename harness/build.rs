//! Embeds relattn's own git revision and a build description, so reports name the code that
//! produced them rather than whatever repository the command runs in. Without git (a source
//! tarball) the revision is left out and the build says so.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    for path in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p);
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        let head = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(head);
        if let Ok(text) = std::fs::read_to_string(head) {
            if let Some(r) = text.trim().strip_prefix("ref: ") {
                if let Some(p) = git(&["rev-parse", "--git-path", r]) {
                    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p);
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
        }
    }
    let revision = git(&["rev-parse", "HEAD"]);
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
    if let Some(rev) = &revision {
        println!("cargo:rustc-env=RELATTN_REVISION={rev}");
    }
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let rev = match &revision {
        Some(r) if dirty => format!("{}+modified", &r[..r.len().min(12)]),
        Some(r) => r[..r.len().min(12)].to_string(),
        None => "no-git".to_string(),
    };
    println!("cargo:rustc-env=RELATTN_BUILD={version} {rev} {profile} {target}");
}
