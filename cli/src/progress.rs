//! Progress bars of the long-running commands.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr (drawn only on a terminal).
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta} left)")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
