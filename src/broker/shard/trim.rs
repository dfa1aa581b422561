//! [`HeapTrim`]: when a shard gives freed heap back to the operating
//! system after its sweeps forgot idle queues and asked names (README
//! "Limits": after a burst of one-off names, resident memory falls again).

use crate::limits;

/// Counts the names forgotten since the heap was last trimmed.
#[derive(Debug, Default)]
pub struct HeapTrim {
    untrimmed: usize,
}

impl HeapTrim {
    /// After a sweep that forgot `forgotten` names (queues and asked
    /// names): whether to trim now. Due once [`limits::QUEUE_SWEEP_TRIM_MIN`]
    /// names were forgotten, in one sweep or several, and at the first
    /// sweep that forgets none after some were: the burst is over, and
    /// what its last sweeps freed goes back too, whatever the order in
    /// which its names ran out of grace. At most one trim per sweep.
    pub fn after_sweep(&mut self, forgotten: usize) -> bool {
        self.untrimmed += forgotten;
        let due = self.untrimmed >= limits::QUEUE_SWEEP_TRIM_MIN || (forgotten == 0 && self.untrimmed > 0);
        if due {
            self.untrimmed = 0;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_enough_names_and_at_the_end_of_a_burst() {
        let mut t = HeapTrim::default();
        assert!(!t.after_sweep(0), "nothing forgotten, nothing to give back");
        assert!(!t.after_sweep(limits::QUEUE_SWEEP_TRIM_MIN - 1));
        assert!(t.after_sweep(1), "the limit reached over two sweeps");
        assert!(!t.after_sweep(0), "trimmed already");
        // A burst's tail: fewer than the limit, then a quiet sweep.
        assert!(!t.after_sweep(5));
        assert!(!t.after_sweep(7));
        assert!(t.after_sweep(0), "the quiet sweep after a burst trims its tail");
        assert!(!t.after_sweep(0));
    }
}
