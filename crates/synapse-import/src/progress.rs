//! Progress reporting for long imports: a narrow trait, an `indicatif` implementation for
//! terminals, and a silent one for tests.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Mutex;

/// Receives progress events. Phases run one after the other.
pub trait Progress {
    /// A phase starts: `total_bytes` to process over `total_items` items (tensors).
    fn start(&self, phase: &str, total_bytes: u64, total_items: u64);
    /// `bytes` more processed, `items` more items done.
    fn advance(&self, bytes: u64, items: u64);
    /// The current phase is over.
    fn finish(&self);
}

/// No output.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: u64, _: u64) {}
    fn finish(&self) {}
}

/// Progress bars on stderr (hidden when stderr is not a terminal): bytes with throughput, and
/// items done in the message.
#[derive(Debug, Default)]
pub struct Bars {
    state: Mutex<Option<(ProgressBar, String, u64, u64)>>,
}

impl Bars {
    /// New bars (nothing is drawn until a phase starts).
    pub fn new() -> Bars {
        Bars::default()
    }
}

impl Progress for Bars {
    fn start(&self, phase: &str, total_bytes: u64, total_items: u64) {
        let bar = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(phase.to_string());
        if total_items > 0 {
            bar.set_message(format!("0/{total_items} tensors"));
        }
        if let Ok(mut s) = self.state.lock() {
            *s = Some((bar, phase.to_string(), 0, total_items));
        }
    }

    fn advance(&self, bytes: u64, items: u64) {
        if let Ok(mut s) = self.state.lock()
            && let Some((bar, _, done, total)) = s.as_mut()
        {
            bar.inc(bytes);
            if items > 0 {
                *done += items;
                bar.set_message(format!("{done}/{total} tensors"));
            }
        }
    }

    fn finish(&self) {
        if let Ok(mut s) = self.state.lock()
            && let Some((bar, _, _, _)) = s.take()
        {
            bar.finish();
        }
    }
}
