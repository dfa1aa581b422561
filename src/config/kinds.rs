//! Kinds of setting: how a value is written (flag, environment variable,
//! TOML file) and how it is checked into the value a program uses.
//!
//! A kind is a unit type naming one [`Kind`] implementation; the settings
//! table ([`crate::config::table`]) gives each setting a kind. Kinds that
//! only one program needs live beside its table.

use std::fmt::{Debug, Display};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::addr;
use crate::limits;

/// How one kind of setting is written and checked.
///
/// `Raw` is what a flag or an environment variable (through
/// [`Kind::parse`]) or the TOML file (through serde) gives; [`Kind::check`]
/// turns it into `Value`.
pub trait Kind {
    /// The value as written. `Clone + Send + Sync + 'static` for clap,
    /// `Serialize` to print it back as TOML.
    type Raw: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The checked value, as the program's configuration holds it.
    type Value: PartialEq + Debug;
    /// Whether the flag may be given more than once (a list: the values are
    /// joined with [`Kind::join`]).
    const REPEATED: bool = false;
    /// The value of the flag given bare (`--flag` alone), if it may be:
    /// see [`Switch`].
    const BARE: Option<&'static str> = None;

    /// Reads one flag value or an environment variable's text.
    ///
    /// # Errors
    /// Why the text is not a value of this kind.
    fn parse(text: &str) -> Result<Self::Raw, String>;

    /// The value of a flag given several times (only when
    /// [`Kind::REPEATED`]): by default the last one.
    fn join(values: Vec<Self::Raw>) -> Option<Self::Raw> {
        values.into_iter().last()
    }

    /// Checks a value that was given (or is the default).
    ///
    /// # Errors
    /// Why the value is wrong; the caller adds the setting's name.
    fn check(raw: Self::Raw) -> Result<Self::Value, String>;

    /// The value of a setting that nobody gave and that has no default.
    ///
    /// # Errors
    /// By default `must be set`; optional kinds ([`Optional`]) return `None`.
    fn absent() -> Result<Self::Value, String> {
        Err("must be set".into())
    }
}

/// Any value taken as it is written: a string, a number, `true`/`false`, a
/// path.
pub struct Plain<T>(PhantomData<T>);

impl<T> Kind for Plain<T>
where
    T: Clone + Debug + PartialEq + FromStr<Err: Display> + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    type Raw = T;
    type Value = T;

    fn parse(text: &str) -> Result<T, String> {
        text.parse().map_err(|e: T::Err| e.to_string())
    }

    fn check(raw: T) -> Result<T, String> {
        Ok(raw)
    }
}

/// A `bool` whose flag may also be given bare: `--flag` is `--flag true`.
pub struct Switch;

impl Kind for Switch {
    type Raw = bool;
    type Value = bool;
    const BARE: Option<&'static str> = Some("true");

    fn parse(text: &str) -> Result<bool, String> {
        Plain::<bool>::parse(text)
    }

    fn check(raw: bool) -> Result<bool, String> {
        Ok(raw)
    }
}

/// A count that must be at least 1 (`usize`).
pub struct AtLeastOne;

impl Kind for AtLeastOne {
    type Raw = usize;
    type Value = usize;

    fn parse(text: &str) -> Result<usize, String> {
        Plain::<usize>::parse(text)
    }

    fn check(n: usize) -> Result<usize, String> {
        if n == 0 {
            return Err("must be at least 1".into());
        }
        Ok(n)
    }
}

/// A duration in humantime syntax (`3s`, `250ms`, `5m`).
pub struct Humantime;

impl Kind for Humantime {
    type Raw = DurationText;
    type Value = Duration;

    fn parse(text: &str) -> Result<DurationText, String> {
        Ok(text.into())
    }

    fn check(text: DurationText) -> Result<Duration, String> {
        text.parse()
    }
}

/// A duration in humantime syntax that must be more than zero.
pub struct Period;

impl Kind for Period {
    type Raw = DurationText;
    type Value = Duration;

    fn parse(text: &str) -> Result<DurationText, String> {
        Ok(text.into())
    }

    fn check(text: DurationText) -> Result<Duration, String> {
        match text.parse()? {
            d if d.is_zero() => Err("must be more than 0".into()),
            d => Ok(d),
        }
    }
}

/// A period in humantime syntax where `0s` means off (`None`).
pub struct HumantimeOrOff;

impl Kind for HumantimeOrOff {
    type Raw = DurationText;
    type Value = Option<Duration>;

    fn parse(text: &str) -> Result<DurationText, String> {
        Ok(text.into())
    }

    fn check(text: DurationText) -> Result<Option<Duration>, String> {
        Humantime::check(text).map(|period| (!period.is_zero()).then_some(period))
    }
}

/// The period of a report (a log line, a latency file) in humantime syntax:
/// `0s` means off (`None`), else at least [`limits::MIN_REPORT_PERIOD`]: a
/// shorter period would keep an idle program busy writing reports (a black-box
/// test's `latency_interval = "1ns"` took 1.7 cores).
pub struct ReportPeriodOrOff;

impl Kind for ReportPeriodOrOff {
    type Raw = DurationText;
    type Value = Option<Duration>;

    fn parse(text: &str) -> Result<DurationText, String> {
        Ok(text.into())
    }

    fn check(text: DurationText) -> Result<Option<Duration>, String> {
        match Humantime::check(text)? {
            d if d.is_zero() => Ok(None),
            d if d < limits::MIN_REPORT_PERIOD => {
                Err(format!("must be 0s (off) or at least {}", humantime::format_duration(limits::MIN_REPORT_PERIOD)))
            }
            d => Ok(Some(d)),
        }
    }
}

/// The text protocol's listen address, `ip:port`, or `off` (or empty) for
/// none.
pub struct TextListen;

impl Kind for TextListen {
    type Raw = String;
    type Value = Option<SocketAddr>;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<Option<SocketAddr>, String> {
        match text.as_str() {
            "off" | "" => Ok(None),
            a => {
                addr::text(a).map_err(|e| e.to_string())?;
                a.parse().map(Some).map_err(|_| format!("{text:?} is not an IP address and port (a listener needs an IP address, e.g. 127.0.0.1:47294), or off"))
            }
        }
    }
}

/// A text-protocol address to connect to, `host:port`.
pub struct TextAddr;

impl Kind for TextAddr {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<String, String> {
        addr::text(&text).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// Text-protocol addresses to connect to: one `host:port`, or owners
/// separated by `;` and one owner's addresses (owner, standby) by `,`
/// ([`addr::text_owners`], docs/scaleout.md). Kept as written.
pub struct TextOwnerList;

impl Kind for TextOwnerList {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<String, String> {
        addr::text_owners(&text).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// An eMQP (ZeroMQ) address, `tcp://host:port` ([`addr::emqp`]).
pub struct EmqpAddr;

impl Kind for EmqpAddr {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<String, String> {
        addr::emqp(&text).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// The router addresses a client follows: one eMQP address, or several
/// separated by commas in the same setting (`--frontend
/// tcp://a:47291,tcp://b:47291`, `EMQ_FRONTEND_ADDR`, or one TOML string);
/// [`addr::emqp_list`]. The program connects to all of them
/// (docs/failover.md). Semicolons separate router names a program spreads
/// its work over ([`addr::emqp_owners`], docs/scaleout.md).
pub struct EmqpAddrs;

impl Kind for EmqpAddrs {
    type Raw = String;
    type Value = AddrList;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<AddrList, String> {
        let owners = addr::emqp_owners(&text).map_err(|e| e.to_string())?;
        Ok(AddrList { flat: owners.iter().flatten().cloned().collect(), owners })
    }
}

/// A checked list of eMQP addresses ([`EmqpAddrs`]): every address, in
/// order (what the list derefs to: one socket connected to all follows a
/// failover), and the same addresses by owner (router name, split at
/// `;`: a program spreading its work keeps one socket per owner).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddrList {
    flat: Vec<String>,
    owners: Vec<Vec<String>>,
}

impl AddrList {
    /// The addresses by owner (at least one owner when checked).
    pub fn owners(&self) -> &[Vec<String>] {
        &self.owners
    }

    /// Each owner's addresses joined by commas: one list string per owner,
    /// as [`crate::client`] connects to it.
    pub fn owner_lists(&self) -> Vec<String> {
        self.owners.iter().map(|o| o.join(",")).collect()
    }

    /// The whole list as written back: owners joined by `;`, addresses by `,`.
    pub fn to_list_string(&self) -> String {
        self.owner_lists().join(";")
    }
}

impl std::ops::Deref for AddrList {
    type Target = Vec<String>;

    fn deref(&self) -> &Vec<String> {
        &self.flat
    }
}

/// Router addresses given as a repeatable flag (`--backend a --backend
/// b`, or commas and semicolons inside one value as in [`EmqpAddrs`]):
/// each value as written, checked with [`addr::emqp_list`]. Join the
/// values with `,` and split with [`addr::emqp_owners`] for the owners.
pub struct EmqpAddrValues;

impl Kind for EmqpAddrValues {
    type Raw = Vec<String>;
    type Value = Vec<String>;
    const REPEATED: bool = true;

    fn parse(text: &str) -> Result<Vec<String>, String> {
        Ok(vec![text.trim().to_string()])
    }

    fn join(values: Vec<Vec<String>>) -> Option<Vec<String>> {
        Some(values.into_iter().flatten().collect())
    }

    fn check(raw: Vec<String>) -> Result<Vec<String>, String> {
        for value in &raw {
            addr::emqp_list(value).map_err(|e| e.to_string())?;
        }
        Ok(raw)
    }
}

/// An eMQP address, or `off` for none.
pub struct EmqpAddrOrOff;

impl Kind for EmqpAddrOrOff {
    type Raw = String;
    type Value = Option<String>;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<Option<String>, String> {
        match text.as_str() {
            "off" => Ok(None),
            _ => EmqpAddr::check(text).map(Some),
        }
    }
}

/// A log filter in tracing-subscriber's syntax (`info`, `emq=debug`,
/// `warn,emq::broker=debug`).
pub struct LogFilter;

impl Kind for LogFilter {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(text: String) -> Result<String, String> {
        match tracing_subscriber::EnvFilter::try_new(&text) {
            Ok(_) => Ok(text),
            Err(e) => Err(format!("{text:?} is not a log filter ({e}); examples: info, emq=debug")),
        }
    }
}

/// A list of settings of kind `K`: a flag given once per item, a TOML
/// array, or a variable with the items separated by commas. An empty list
/// is a value (an empty variable gives one).
pub struct Many<K>(PhantomData<K>);

impl<K: Kind> Kind for Many<K> {
    type Raw = Vec<K::Raw>;
    type Value = Vec<K::Value>;
    const REPEATED: bool = true;

    fn parse(text: &str) -> Result<Vec<K::Raw>, String> {
        text.split(',').map(str::trim).filter(|item| !item.is_empty()).map(K::parse).collect()
    }

    fn join(values: Vec<Vec<K::Raw>>) -> Option<Vec<K::Raw>> {
        Some(values.into_iter().flatten().collect())
    }

    fn check(raw: Vec<K::Raw>) -> Result<Vec<K::Value>, String> {
        raw.into_iter().map(K::check).collect()
    }
}

/// A setting of kind `K` with no default: `None` unless given.
pub struct Optional<K>(PhantomData<K>);

impl<K: Kind> Kind for Optional<K> {
    type Raw = K::Raw;
    type Value = Option<K::Value>;

    fn parse(text: &str) -> Result<K::Raw, String> {
        K::parse(text)
    }

    fn check(raw: K::Raw) -> Result<Option<K::Value>, String> {
        K::check(raw).map(Some)
    }

    fn absent() -> Result<Option<K::Value>, String> {
        Ok(None)
    }
}

/// A duration as written (`300s`, `250ms`, `5m`). It is parsed when
/// checked, so that a malformed one is reported with its setting's name
/// whether it came from a flag, a variable or the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationText(pub String);

impl DurationText {
    /// Parses the text with humantime (surrounding spaces ignored).
    ///
    /// # Errors
    /// The text and humantime's reason, e.g. `"3x": unknown time unit "x"`.
    pub fn parse(&self) -> Result<Duration, String> {
        humantime::parse_duration(self.0.trim()).map_err(|e| format!("{:?}: {e}", self.0))
    }
}

/// Whole seconds as `300s`, whole milliseconds as `250ms`, anything else in
/// humantime's own format: the way durations are written in config files.
impl From<Duration> for DurationText {
    fn from(d: Duration) -> DurationText {
        let text = match (d.subsec_nanos(), d.subsec_nanos() % 1_000_000) {
            (0, _) => format!("{}s", d.as_secs()),
            (_, 0) => format!("{}ms", d.as_millis()),
            _ => humantime::format_duration(d).to_string(),
        };
        DurationText(text)
    }
}

impl From<&str> for DurationText {
    fn from(text: &str) -> DurationText {
        DurationText(text.to_string())
    }
}

impl From<String> for DurationText {
    fn from(text: String) -> DurationText {
        DurationText(text)
    }
}

impl FromStr for DurationText {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<DurationText, Self::Err> {
        Ok(text.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_the_way_config_files_write_them() {
        let text = |d| DurationText::from(d).0;
        assert_eq!(text(Duration::from_secs(300)), "300s");
        assert_eq!(text(Duration::from_millis(250)), "250ms");
        assert_eq!(text(Duration::from_micros(1500)), "1ms 500us");
        for d in [Duration::ZERO, Duration::from_secs(3), Duration::from_millis(1), Duration::from_nanos(7)] {
            assert_eq!(DurationText::from(d).parse(), Ok(d));
        }
    }

    #[test]
    fn kinds_check_and_explain() {
        assert_eq!(AtLeastOne::check(0), Err("must be at least 1".into()));
        assert_eq!(HumantimeOrOff::check("0s".into()), Ok(None));
        assert_eq!(Period::check("0s".into()), Err("must be more than 0".into()));
        assert_eq!(HumantimeOrOff::check(" 60s ".into()), Ok(Some(Duration::from_secs(60))));
        assert_eq!(ReportPeriodOrOff::check("0s".into()), Ok(None));
        assert_eq!(ReportPeriodOrOff::check("1s".into()), Ok(Some(Duration::from_secs(1))));
        for short in ["1ns", "999ms"] {
            assert_eq!(ReportPeriodOrOff::check(short.into()), Err("must be 0s (off) or at least 1s".into()));
        }
        assert!(Humantime::check("3x".into()).unwrap_err().contains("\"3x\""));
        assert_eq!(TextListen::check("off".into()), Ok(None));
        assert_eq!(TextListen::check("127.0.0.1:1".into()), Ok(Some(([127, 0, 0, 1], 1).into())));
        assert!(TextListen::check("nowhere".into()).unwrap_err().contains("the text address is host:port"));
        assert!(TextListen::check("localhost:1".into()).unwrap_err().contains("needs an IP address"));
        assert!(EmqpAddr::check("127.0.0.1:1".into()).unwrap_err().contains("eMQP addresses look like tcp://"));
        assert_eq!(EmqpAddrOrOff::check("off".into()), Ok(None));
        let list = EmqpAddrs::check("tcp://a:1,tcp://b:2".into()).unwrap();
        assert_eq!(*list, vec!["tcp://a:1".to_string(), "tcp://b:2".into()]);
        assert_eq!(list.owner_lists(), ["tcp://a:1,tcp://b:2"]);
        let two = EmqpAddrs::check("tcp://a:1,tcp://b:2; tcp://c:3".into()).unwrap();
        assert_eq!(two.len(), 3);
        assert_eq!(two.owner_lists(), ["tcp://a:1,tcp://b:2", "tcp://c:3"]);
        assert_eq!(two.to_list_string(), "tcp://a:1,tcp://b:2;tcp://c:3");
        assert_eq!(EmqpAddrValues::check(vec!["tcp://a:1;tcp://b:2".into()]), Ok(vec!["tcp://a:1;tcp://b:2".into()]));
        assert!(EmqpAddrValues::check(vec!["tcp://a:1;b:2".into()]).is_err());
        assert!(EmqpAddrs::check("tcp://a:1,b:2".into()).unwrap_err().contains("\"b:2\" is not an eMQP address"));
        assert_eq!(Many::<EmqpAddr>::parse("tcp://a:1, tcp://b:2"), Ok(vec!["tcp://a:1".into(), "tcp://b:2".into()]));
        assert_eq!(Many::<AtLeastOne>::join(vec![vec![1], vec![2, 3]]), Some(vec![1, 2, 3]));
        assert!(Many::<AtLeastOne>::check(vec![1, 0]).is_err());
        assert!(LogFilter::check("emq=debug".into()).is_ok());
        assert!(LogFilter::check("emq=loud".into()).unwrap_err().contains("is not a log filter"));
        assert_eq!(Optional::<AtLeastOne>::absent(), Ok(None));
        assert_eq!(Plain::<bool>::absent(), Err("must be set".into()));
    }
}
