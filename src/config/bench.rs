//! `emq-bench`'s settings: its log filter ([`RawBenchConfig`]), so it takes
//! `--config`, `--print-config` and `log` like every program. What it
//! measures (the target's addresses, the load) are flags of each mode,
//! except the `emqp` mode's CURVE keys, which take emq-worker's setting
//! names (`curve_key_file`, `curve_server_key`), and the `text` mode's TLS
//! and token, which take emq-cli's (`tls_ca`, `tls_server_name`,
//! `tls_cert`, `tls_key`, `token_file`).

use std::path::PathBuf;

use super::kinds::{LogFilter, Optional, Plain};
use super::table::{settings, Settings};
use crate::limits;

settings! {
    /// emq-bench's settings as flags, `EMQ_*` variables and the TOML file
    /// give them.
    pub struct RawBenchConfig => BenchSettings {
        /// Log filter (`warn`; `info` for more).
        log: LogFilter = limits::TOOL_LOG, env "EMQ_LOG";
        /// `emqp` mode: the CURVE secret key file (`NAME.key_secret`, mode 0600) every client and
        /// worker of the load connects with, as a CURVE client (with `curve_server_key`; the
        /// frontend and backend addresses must be the router's `frontend_curve` and
        /// `backend_curve`). Other modes ignore it.
        curve_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_KEY_FILE";
        /// `emqp` mode: the router's CURVE public key: 40 Z85 characters or a `.key` file; one for
        /// all addresses, or one per address in the same order, separated by commas.
        curve_server_key: Optional<Plain<String>>, env "EMQ_CURVE_SERVER_KEY";
        /// `text` mode: PEM CA certificates: every connection talks TLS to `--addr` (a router's
        /// `text_tls` listener), trusting these. Other modes refuse it.
        tls_ca: Optional<Plain<PathBuf>>, env "EMQ_TLS_CA";
        /// `text` mode: the name the server's certificate must carry (default: the host of `--addr`).
        tls_server_name: Optional<Plain<String>>, env "EMQ_TLS_SERVER_NAME";
        /// `text` mode: PEM client certificate for a `text_tls` listener that requires one (with
        /// `tls_key`).
        tls_cert: Optional<Plain<PathBuf>>, env "EMQ_TLS_CERT";
        /// `text` mode: PEM private key of `tls_cert`.
        tls_key: Optional<Plain<PathBuf>>, env "EMQ_TLS_KEY";
        /// `text` mode: file holding a text protocol token (its first line), sent as `AUTH <token>`
        /// first on every connection. Other modes refuse it.
        token_file: Optional<Plain<PathBuf>>, env "EMQ_TOKEN_FILE";
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
