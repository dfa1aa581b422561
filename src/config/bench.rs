//! `emq-bench`'s settings: its log filter ([`RawBenchConfig`]), so it takes
//! `--config`, `--print-config` and `log` like every program. What it
//! measures (the target's addresses, the load) are flags of each mode.

use super::kinds::LogFilter;
use super::table::{settings, Settings};
use crate::limits;

settings! {
    /// emq-bench's settings as flags, `EMQ_*` variables and the TOML file
    /// give them.
    pub struct RawBenchConfig => BenchSettings {
        /// Log filter (`warn`; `info` for more).
        log: LogFilter = limits::TOOL_LOG, env "EMQ_LOG";
    }
}

/// The commented default configuration of emq-bench.
pub const BENCH_TOML: &str = include_str!("bench.toml");

super::table::program!(RawBenchConfig => BenchSettings, BENCH_TOML, Settings::build);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_matches_the_table() {
        assert_eq!(super::super::template::problems::<RawBenchConfig>(BENCH_TOML), Vec::<String>::new());
    }
}
