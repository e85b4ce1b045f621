//! Standard output that ends quietly when its reader goes away (`relattn matrix --show nightly
//! | head`): a broken pipe is not an error of the command, and never a panic.

use std::io::{self, Write};

/// Print `text` to standard output. A reader that closed the pipe ends the output quietly:
/// the rest is dropped and the command goes on (and exits 0).
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot write to standard output: {e}"),
        )),
        Ok(()) => Ok(()),
    }
}

/// For output printed with `print!`, `println!` and `eprintln!`, which panic when a write
/// fails: a broken pipe ends the process quietly with 141 (128 + SIGPIPE, what a shell reports
/// for a process killed by it); any other write error (`> /dev/full`: no space left) ends it
/// with one line on stderr, when stderr can still take it, and exit 2, never a panic message.
/// Every other panic keeps the default report.
pub fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_broken_pipe_panic(message) {
            std::process::exit(141);
        }
        if let Some(why) = message.strip_prefix("failed printing to ") {
            let _ = writeln!(io::stderr(), "error: cannot write to {why}");
            std::process::exit(2);
        }
        default(info);
    }));
}

/// The message std's print macros panic with when the stream's reader is gone.
fn is_broken_pipe_panic(message: &str) -> bool {
    message.starts_with("failed printing to std")
        && (message.contains("Broken pipe") || message.contains("os error 32"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_broken_pipes_are_quiet() {
        assert!(is_broken_pipe_panic(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!is_broken_pipe_panic(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!is_broken_pipe_panic("index out of bounds"));
    }
}
