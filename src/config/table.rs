//! One table per program declares each setting once; `settings!` turns it
//! into everything that used to name the setting separately:
//!
//! * the raw struct: an `Option` field per setting, which is the TOML key
//!   (serde, unknown keys rejected) and the `--flag` (a clap `Args` impl:
//!   the flag is the key with `-` for `_`, its values read by
//!   [`Kind::parse`], repeatable when the kind is a list, [`Kind::REPEATED`]);
//! * [`Settings::from_env`]: the setting's `EMQ_*` variable;
//! * [`Settings::or`]: the merge, flag over variable over file;
//! * the typed config and its groups: a field per setting, of its kind's
//!   checked type ([`Kind::Value`]), with the setting's doc;
//! * [`Settings::build`]: defaults applied and each value checked by its
//!   [`Kind`] into that typed config, nested as the table nests;
//! * [`Settings::NAMES`], [`Settings::set_values`] and
//!   [`Settings::differing_keys`]: what `--print-config` and the test of the
//!   commented default file ([`crate::config::template`]) need.
//!
//! A table entry reads
//!
//! ```text
//! /// Doc: the flag's help and the raw field's doc.
//! key: Kind = default, env "EMQ_KEY";
//! ```
//!
//! `= default` may be left out (the kind's [`Kind::absent`] then decides);
//! the default is anything that converts `Into` the kind's raw type.
//! `, short 'Q'` adds a one-letter flag. A renamed setting keeps its old
//! name working with `, was old_key "EMQ_OLD_KEY"` (a hidden `--old-key`
//! flag, the old variable and the old file key, each logging a deprecation
//! warning), or `, was old_key` when the variable kept its name. The typed
//! config's field is the key, or another name with `key => field: Kind …`.
//! Entries of a nested config struct go in a group `field: Struct { //!
//! doc … }` after the top-level ones (the group's doc an inner comment),
//! each written `key => field: Kind …`.
//!
//! Checks that involve several settings stay hand-written, after
//! [`Settings::build`] (see the router's `validate`).

use std::ffi::OsString;

use serde::de::DeserializeOwned;

use super::kinds::Kind;
use super::ConfigError;

/// The names of one setting.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// TOML key, and the flag with `-` for `_`.
    pub key: &'static str,
    /// Environment variable.
    pub env: &'static str,
    /// Deprecated names still accepted: `(key, env)`.
    pub was: &'static [(&'static str, &'static str)],
}

/// A program's raw settings, as `settings!` generates them.
pub trait Settings: Sized + Clone + Default + DeserializeOwned {
    /// The typed configuration [`Settings::build`] returns.
    type Config;
    /// Every setting's names, in table order.
    const NAMES: &'static [Names];

    /// Reads every setting's environment variable (deprecated ones too)
    /// through `lookup` (`std::env::var_os` outside tests). A set but empty
    /// variable is a value, as with clap.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting and the variable, for a
    /// value that does not parse or is not UTF-8.
    fn from_env(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Self, ConfigError>;

    /// Every setting at its built-in default (unset where there is none).
    fn defaults() -> Self;

    /// Fills every setting that `self` leaves unset from `lower`: flags
    /// `.or(env).or(file)`. Values given under a deprecated name first move
    /// to their setting (the current name wins), with a warning.
    fn or(self, lower: Self) -> Self;

    /// Applies the defaults and checks each setting with its kind.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad setting.
    fn build(self) -> Result<Self::Config, ConfigError>;

    /// The settings given (not defaulted), as TOML values, in table order.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a value TOML cannot hold (an integer
    /// above `i64::MAX`).
    fn set_values(&self) -> Result<Vec<(&'static str, toml::Value)>, ConfigError>;

    /// The keys whose checked values differ between `self` and `other`,
    /// defaults applied to both.
    fn differing_keys(&self, other: &Self) -> Vec<&'static str>;
}

/// Checks one setting's value (or its absence) with its kind.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `key`.
pub fn check<K: Kind>(key: &'static str, raw: Option<K::Raw>) -> Result<K::Value, ConfigError> {
    match raw {
        Some(raw) => K::check(raw),
        None => K::absent(),
    }
    .map_err(|why| ConfigError::Invalid { name: key, why })
}

/// Reads and parses environment variable `var` of setting `key`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting and the variable.
pub fn env_value<K: Kind>(
    key: &'static str,
    var: &str,
    lookup: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Option<K::Raw>, ConfigError> {
    let Some(value) = lookup(var) else { return Ok(None) };
    let text =
        value.into_string().map_err(|_| ConfigError::Invalid { name: key, why: format!("{var} is not UTF-8") })?;
    K::parse(&text).map(Some).map_err(|e| ConfigError::Invalid { name: key, why: format!("{var}={text:?}: {e}") })
}

/// A given value as TOML.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `key` when TOML cannot hold the value.
pub fn toml_value<T: serde::Serialize>(key: &'static str, value: &T) -> Result<toml::Value, ConfigError> {
    toml::Value::try_from(value)
        .map_err(|e| ConfigError::Invalid { name: key, why: format!("not printable as TOML: {e}") })
}

/// A flag's help: its doc lines joined, without a final period as clap
/// writes it, then its variable.
pub fn flag_help(doc: &[&str], env: &str) -> String {
    let text: Vec<&str> = doc.iter().map(|line| line.trim()).collect();
    let text = text.join(" ");
    format!("{} [env: {env}]", text.strip_suffix('.').unwrap_or(&text))
}

/// A setting's name without the `r#` of a raw identifier (`r#in` → `in`).
pub fn unraw(name: &'static str) -> &'static str {
    name.strip_prefix("r#").unwrap_or(name)
}

/// The `--flag` of setting `key`: `key` with `-` for `_`; its values are
/// read with [`Kind::parse`], and it may be repeated when the kind is a list.
pub fn flag_arg<K: Kind>(key: &'static str, help: Option<String>, short: Option<char>) -> clap::Arg {
    let name = unraw(key);
    let action = if K::REPEATED { clap::ArgAction::Append } else { clap::ArgAction::Set };
    let parse: fn(&str) -> Result<K::Raw, String> = K::parse;
    let arg = clap::Arg::new(name)
        .long(name.replace('_', "-"))
        .value_name(name.to_uppercase())
        .action(action)
        .value_parser(clap::builder::ValueParser::new(parse))
        .short(short);
    let arg = match K::BARE {
        Some(bare) => arg.num_args(0..=1).default_missing_value(bare),
        None => arg,
    };
    match help {
        Some(help) => arg.help(help),
        None => arg.hide(true),
    }
}

/// The value of setting `key`'s flag, if given (several values of a list
/// joined).
pub fn flag_value<K: Kind>(matches: &mut clap::ArgMatches, key: &'static str) -> Option<K::Raw> {
    let id = unraw(key);
    if K::REPEATED {
        matches.try_remove_many::<K::Raw>(id).ok().flatten().and_then(|values| K::join(values.collect()))
    } else {
        matches.try_remove_one::<K::Raw>(id).ok().flatten()
    }
}

/// Logs that setting `key` was given under its deprecated name `old`
/// (`old_env` empty when the variable did not change).
pub fn warn_deprecated(old: &str, old_env: &str, key: &str, env: &str) {
    let flag = |name: &str| unraw_str(name).replace('_', "-");
    let old_names = match old_env {
        "" => format!("--{}", flag(old)),
        _ => format!("--{}, {old_env}", flag(old)),
    };
    tracing::warn!("setting {} ({old_names}) is deprecated: use {key} (--{}, {env})", unraw_str(old), flag(key));
}

fn unraw_str(name: &str) -> &str {
    name.strip_prefix("r#").unwrap_or(name)
}

/// Declares a program's settings once; see the module docs.
macro_rules! settings {
    (@or_empty $e:literal) => { $e };
    (@or_empty) => { "" };
    (@common [$($raw_attr:tt)*] $vis:vis $Raw:ident $Config:ident
        $( [$($doc:literal)+] $key:ident $kind:ty [$($default:expr)?] $env:literal [$($short:literal)?]
            [$($old:ident $($old_env:literal)?)?] )*
    ) => {
        $($raw_attr)*
        #[derive(Debug, Default, Clone, serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        $vis struct $Raw {
            $(
                $(#[doc = $doc])+
                pub $key: Option<<$kind as $crate::config::Kind>::Raw>,
                $(
                    #[doc = concat!("Deprecated name of `", stringify!($key), "`.")]
                    pub $old: Option<<$kind as $crate::config::Kind>::Raw>,
                )?
            )*
        }

        impl clap::Args for $Raw {
            fn augment_args(cmd: clap::Command) -> clap::Command {
                use $crate::config::table::{flag_arg, flag_help};
                cmd $(
                    .arg(flag_arg::<$kind>(
                        stringify!($key),
                        Some(flag_help(&[$($doc),+], $env)),
                        None $(.or(Some($short)))?,
                    ))
                    $( .arg(flag_arg::<$kind>(stringify!($old), None, None)) )?
                )*
            }

            fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
                <$Raw as clap::Args>::augment_args(cmd)
            }
        }

        impl clap::FromArgMatches for $Raw {
            fn from_arg_matches(matches: &clap::ArgMatches) -> Result<$Raw, clap::Error> {
                <$Raw as clap::FromArgMatches>::from_arg_matches_mut(&mut matches.clone())
            }

            fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<$Raw, clap::Error> {
                use $crate::config::table::flag_value;
                Ok($Raw { $(
                    $key: flag_value::<$kind>(matches, stringify!($key)),
                    $( $old: flag_value::<$kind>(matches, stringify!($old)), )?
                )* })
            }

            fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
                let given = <$Raw as clap::FromArgMatches>::from_arg_matches(matches)?;
                $(
                    self.$key = given.$key.or(self.$key.take());
                    $( self.$old = given.$old.or(self.$old.take()); )?
                )*
                Ok(())
            }
        }

        impl $Raw {
            /// Moves values given under a deprecated name to their setting
            /// (the current name wins), with a warning.
            #[allow(unused_mut, reason = "mutates only when the table has deprecated names")]
            fn fold_deprecated(mut self) -> $Raw {
                $($(
                    if let Some(value) = self.$old.take() {
                        $crate::config::table::warn_deprecated(
                            stringify!($old),
                            $crate::config::table::settings!(@or_empty $($old_env)?),
                            stringify!($key),
                            $env,
                        );
                        self.$key = self.$key.or(Some(value));
                    }
                )?)*
                self
            }

            /// Every unset setting at its default.
            fn with_defaults(self) -> $Raw {
                <$Raw as $crate::config::Settings>::or(self, <$Raw as $crate::config::Settings>::defaults())
            }
        }

        impl $crate::config::Settings for $Raw {
            type Config = $Config;
            const NAMES: &'static [$crate::config::table::Names] = &[
                $( $crate::config::table::Names {
                    key: stringify!($key),
                    env: $env,
                    was: &[$( (stringify!($old), $crate::config::table::settings!(@or_empty $($old_env)?)) )?],
                }, )*
            ];

            fn from_env(
                lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>,
            ) -> Result<$Raw, $crate::config::ConfigError> {
                use $crate::config::table::env_value;
                Ok($Raw { $(
                    $key: env_value::<$kind>(stringify!($key), $env, lookup)?,
                    $( $old: None $( .or(env_value::<$kind>(stringify!($key), $old_env, lookup)?) )?, )?
                )* })
            }

            fn defaults() -> $Raw {
                $Raw { $( $key: None $(.or(Some(Into::into($default))))?, $( $old: None, )? )* }
            }

            fn or(self, lower: $Raw) -> $Raw {
                let (high, low) = (self.fold_deprecated(), lower.fold_deprecated());
                $Raw { $( $key: high.$key.or(low.$key), $( $old: high.$old.or(low.$old), )? )* }
            }

            fn build(self) -> Result<$Config, $crate::config::ConfigError> {
                self.with_defaults().build_checked()
            }

            fn set_values(&self) -> Result<Vec<(&'static str, toml::Value)>, $crate::config::ConfigError> {
                let mut values = Vec::new();
                $(
                    if let Some(v) = self.$key.as_ref()$(.or(self.$old.as_ref()))? {
                        values.push((stringify!($key), $crate::config::table::toml_value(stringify!($key), v)?));
                    }
                )*
                Ok(values)
            }

            fn differing_keys(&self, other: &$Raw) -> Vec<&'static str> {
                use $crate::config::table::check;
                let (a, b) = (self.clone().with_defaults(), other.clone().with_defaults());
                let mut keys = Vec::new();
                $(
                    let differ = check::<$kind>(stringify!($key), a.$key).map_err(|e| e.to_string())
                        != check::<$kind>(stringify!($key), b.$key).map_err(|e| e.to_string());
                    if differ {
                        keys.push(stringify!($key));
                    }
                )*
                keys
            }
        }
    };
    (@build $vis:vis $Raw:ident $Config:ident [$($done:tt)*]
        [([$($doc:literal)+] $key:ident [] $kind:ty) $($rest:tt)*] $groups:tt
    ) => {
        $crate::config::table::settings!(@build $vis $Raw $Config [$($done)* ([$($doc)+] $key $key $kind)]
            [$($rest)*] $groups);
    };
    (@build $vis:vis $Raw:ident $Config:ident [$($done:tt)*]
        [([$($doc:literal)+] $key:ident [$field:ident] $kind:ty) $($rest:tt)*] $groups:tt
    ) => {
        $crate::config::table::settings!(@build $vis $Raw $Config [$($done)* ([$($doc)+] $key $field $kind)]
            [$($rest)*] $groups);
    };
    (@build $vis:vis $Raw:ident $Config:ident [$(([$($doc:literal)+] $key:ident $field:ident $kind:ty))*] []
        { $( [$($group_doc:literal)+] $group:ident $Group:ident {
            $( ([$($gdoc:literal)+] $gkey:ident $gfield:ident $gkind:ty) )*
        } )* }
    ) => {
        #[doc = concat!("The checked settings of [`", stringify!($Raw), "`]: each value checked by its kind, ")]
        #[doc = "defaults applied ([`crate::config::Settings::build`]). Generated from the table, one field per"]
        #[doc = "setting (its doc is the setting's), grouped as the table groups them."]
        #[derive(Debug, Clone)]
        $vis struct $Config {
            $(
                $(#[doc = $doc])+
                pub $field: <$kind as $crate::config::Kind>::Value,
            )*
            $(
                $(#[doc = $group_doc])+
                pub $group: $Group,
            )*
        }

        $(
            $(#[doc = $group_doc])+
            #[doc = ""]
            #[doc = concat!("A group of [`", stringify!($Config), "`], generated from its table.")]
            #[derive(Debug, Clone)]
            $vis struct $Group {
                $(
                    $(#[doc = $gdoc])+
                    pub $gfield: <$gkind as $crate::config::Kind>::Value,
                )*
            }
        )*

        impl $Raw {
            /// Checks every setting of a raw config whose defaults are applied.
            fn build_checked(self) -> Result<$Config, $crate::config::ConfigError> {
                use $crate::config::table::check;
                Ok($Config {
                    $( $field: check::<$kind>(stringify!($key), self.$key)?, )*
                    $( $group: $Group { $( $gfield: check::<$gkind>(stringify!($gkey), self.$gkey)?, )* }, )*
                })
            }
        }
    };
    (
        $(#[doc = $raw_doc:literal])*
        $vis:vis struct $Raw:ident => $Config:ident {
            $(
                $(#[doc = $doc:literal])+
                $key:ident $(=> $field:ident)?: $kind:ty $(= $default:expr)?, env $env:literal
                    $(, short $short:literal)? $(, was $old:ident $($old_env:literal)?)?;
            )*
            $(
                $group:ident: $Group:ident {
                    $(#![doc = $group_doc:literal])+
                    $(
                        $(#[doc = $gdoc:literal])+
                        $gkey:ident => $gfield:ident: $gkind:ty $(= $gdefault:expr)?, env $genv:literal
                            $(, was $gold:ident $($gold_env:literal)?)?;
                    )*
                }
            )*
        }
    ) => {
        $crate::config::table::settings!(@common [$(#[doc = $raw_doc])*] $vis $Raw $Config
            $( [$($doc)+] $key $kind [$($default)?] $env [$($short)?] [$($old $($old_env)?)?] )*
            $( $( [$($gdoc)+] $gkey $gkind [$($gdefault)?] $genv [] [$($gold $($gold_env)?)?] )* )*
        );
        $crate::config::table::settings!(@build $vis $Raw $Config [] [$( ([$($doc)+] $key [$($field)?] $kind) )*]
            { $( [$($group_doc)+] $group $Group { $( ([$($gdoc)+] $gkey $gfield $gkind) )* } )* });
    };
}

pub(crate) use settings;

/// Implements [`crate::config::Program`] for a settings table whose checked
/// config has a `log` field: `program!(RawX => X, X_TOML, check_fn)`.
macro_rules! program {
    ($Raw:ty => $Checked:ty, $template:expr, $check:path) => {
        impl $crate::config::Program for $Raw {
            type Checked = $Checked;
            const TEMPLATE: &'static str = $template;

            fn check(self) -> Result<$Checked, $crate::config::ConfigError> {
                $check(self)
            }

            fn log(c: &$Checked) -> &str {
                &c.log
            }
        }
    };
}

pub(crate) use program;
