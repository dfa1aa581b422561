//! `emq-cli`: admin and client commands for an emq (or EventMQ) broker.
//!
//! Human-readable output by default, `--json` for scripts. Every command
//! waits at most `--timeout` (default 3 s); an unreachable broker is a
//! one-line error on stderr and exit status 1.

use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use emq::client::admin::AdminClient;
use emq::client::body::PythonCall;
use emq::client::emqp::{Client, Outcome, Publisher, Schedule, ScheduleAnswer};
use emq::client::text::TextClient;
use emq::limits;
use serde_json::Value;

#[path = "emq-cli/table.rs"]
mod table;

/// Talk to an emq broker: admin queries, requests, schedules, publish.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Router admin socket.
    #[arg(long, env = "EMQ_ADMIN_ADDR", default_value = limits::ADMIN_ADDR, global = true)]
    admin: String,
    /// Router frontend (requests, schedules).
    #[arg(long, env = "EMQ_FRONTEND_ADDR", default_value = limits::FRONTEND_ADDR, global = true)]
    frontend: String,
    /// Scheduler admin socket.
    #[arg(long, env = "EMQ_SCHEDULER_ADMIN_ADDR", default_value = limits::SCHEDULER_ADMIN_ADDR, global = true)]
    scheduler_admin: String,
    /// Text protocol address (`sched`, `ask`).
    #[arg(long, env = "EMQ_TEXT_ADDR", default_value = limits::TEXT_ADDR, global = true)]
    text: String,
    /// Pub/sub device's incoming address.
    #[arg(long, env = "EMQ_PUBSUB_ADDR", default_value = limits::PUBSUB_IN_ADDR, global = true)]
    pubsub: String,
    /// Longest wait for a connection and an answer.
    #[arg(long, default_value_t = limits::CLIENT_TIMEOUT.into(), global = true)]
    timeout: humantime::Duration,
    /// Print raw JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

/// A job body: raw bytes or a Python call.
#[derive(clap::Args)]
struct BodyArgs {
    /// Raw body (e.g. JSON text). Omit when using --callable.
    body: Option<String>,
    /// Python call as `module.function` (builds `["run", {…}]`, spec §4.1).
    #[arg(long)]
    callable: Option<String>,
    /// Python module path (with --callable NAME for a plain name, or `mod:Class`).
    #[arg(long)]
    path: Option<String>,
    /// Positional arguments as a JSON array.
    #[arg(long, default_value = "[]")]
    args: String,
    /// Keyword arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    kwargs: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Router STATUS: per-queue waiting, in-flight, processed, latency.
    Status,
    /// Connected workers and their queues.
    Workers,
    /// Connected schedulers.
    Schedulers,
    /// Per-queue latency percentiles (emq extension).
    Latency,
    /// Schedules held by the scheduler (its admin socket, command SCHEDULES).
    Schedules,
    /// Send a REQUEST and wait for the broker's acceptance.
    Request {
        /// Queue name.
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Headers CSV, e.g. `reply-requested,timeout:30`.
        #[arg(long, default_value = "")]
        headers: String,
    },
    /// SCHEDULE a job every N (--every 60s) or on a cron expression (--cron).
    Schedule {
        /// Queue the job runs on.
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Interval, e.g. `60s`, `5m`.
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "cron", required_unless_present = "cron")]
        every: Option<Duration>,
        /// 5-field cron expression (UTC).
        #[arg(long)]
        cron: Option<String>,
        /// Headers CSV (`guarantee` like the Python helpers; `nohaste`, `run_count:N`).
        #[arg(long, default_value = "guarantee")]
        headers: String,
    },
    /// UNSCHEDULE the job with this body.
    Unschedule {
        /// Queue name (not used for matching).
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Headers CSV.
        #[arg(long, default_value = "guarantee")]
        headers: String,
    },
    /// PUBLISH a message on a topic through the pub/sub device.
    Publish {
        /// Topic (subscribers filter by prefix).
        topic: String,
        /// Message, sent as given.
        message: String,
    },
    /// Ask the router to shut down (DISCONNECT) and wait for its ACK.
    Disconnect,
    /// Text protocol: SCHED a task (no reply on success; errors are shown).
    Sched {
        /// The task's data (one line).
        data: String,
        /// Queue (default: `default`).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Text protocol: ASK for a task and answer the offer (default: ACK).
    Ask {
        /// Queue.
        #[arg(default_value = limits::DEFAULT_QUEUE)]
        queue: String,
        /// Decline the task: it goes to the back of its queue.
        #[arg(long, conflicts_with_all = ["del"])]
        dcl: bool,
        /// Delete the task.
        #[arg(long)]
        del: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        eprintln!("emq-cli: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let admin =
        |addr: &str| -> anyhow::Result<AdminClient> { Ok(AdminClient::connect(addr)?.with_timeout(*cli.timeout)) };
    match &cli.command {
        Cmd::Status => show(cli, admin(&cli.admin)?.status()?, table::status),
        Cmd::Workers => show(cli, admin(&cli.admin)?.workers()?, table::workers),
        Cmd::Schedulers => show(cli, admin(&cli.admin)?.schedulers()?, table::schedulers),
        Cmd::Latency => show(cli, admin(&cli.admin)?.latency()?, table::generic),
        Cmd::Schedules => show(cli, admin(&cli.scheduler_admin)?.query(b"SCHEDULES")?, table::generic),
        Cmd::Request { queue, .. } if queue.is_empty() => Err(anyhow!("the queue name must not be empty")),
        Cmd::Request { queue, body, headers } => request(cli, queue, &build_body(body)?, headers),
        Cmd::Schedule { queue, body, every, cron, headers } => {
            let when = match (every, cron) {
                (Some(d), _) if d.subsec_nanos() != 0 => return Err(anyhow!("--every must be whole seconds")),
                (Some(d), _) => Schedule::Interval(d.as_secs()),
                (None, Some(c)) => Schedule::Cron(c.clone()),
                (None, None) => return Err(anyhow!("give --every or --cron")),
            };
            let mut client = Client::connect(&cli.frontend)?.with_timeout(*cli.timeout);
            let answer = client.schedule_confirmed(queue, &when, &build_body(body)?, headers)?;
            schedule_answer(cli, "SCHEDULE", answer)
        }
        Cmd::Unschedule { queue, body, headers } => {
            let mut client = Client::connect(&cli.frontend)?.with_timeout(*cli.timeout);
            let answer = client.unschedule_confirmed(queue, &build_body(body)?, headers)?;
            schedule_answer(cli, "UNSCHEDULE", answer)
        }
        Cmd::Publish { topic, message } => {
            let mut p = Publisher::connect(&cli.pubsub)?.with_timeout(*cli.timeout);
            let msgid = p.publish(topic.as_bytes(), message.as_bytes())?;
            sent(cli, "PUBLISH", &msgid)
        }
        Cmd::Disconnect => {
            admin(&cli.admin)?.disconnect()?;
            sent(cli, "DISCONNECT (acknowledged)", b"")
        }
        Cmd::Sched { data, queue } => {
            let mut c = text_client(cli)?;
            c.sched(data.as_bytes(), queue.as_deref())?;
            c.end()?;
            sent(cli, "SCHED", b"")
        }
        Cmd::Ask { queue, dcl, del } => ask(cli, queue, *dcl, *del),
    }
}

fn text_client(cli: &Cli) -> anyhow::Result<TextClient> {
    TextClient::connect(cli.text.as_str(), *cli.timeout).with_context(|| format!("text protocol at {}", cli.text))
}

/// ASK, then ACK (default), DCL or DEL; prints the task's data or `NOPE`.
fn ask(cli: &Cli, queue: &str, dcl: bool, del: bool) -> anyhow::Result<()> {
    let mut c = text_client(cli)?;
    let task = c.ask(queue)?;
    if task.is_some() {
        match (dcl, del) {
            (true, _) => c.dcl()?,
            (_, true) => c.del()?,
            _ => c.ack()?,
        }
    }
    c.end()?;
    match (cli.json, task) {
        (true, Some(t)) => println!("{}", serde_json::json!({ "task": String::from_utf8_lossy(&t) })),
        (true, None) => println!("{}", serde_json::json!({ "task": null })),
        (false, Some(t)) => println!("{}", String::from_utf8_lossy(&t)),
        (false, None) => println!("NOPE"),
    }
    Ok(())
}

fn show(cli: &Cli, value: Value, human: fn(&Value) -> String) -> anyhow::Result<()> {
    if cli.json {
        println!("{value}");
    } else {
        print!("{}", human(&value));
    }
    Ok(())
}

fn sent(cli: &Cli, what: &str, msgid: &[u8]) -> anyhow::Result<()> {
    let id = String::from_utf8_lossy(msgid);
    if cli.json {
        println!("{}", serde_json::json!({"sent": what, "msgid": id}));
    } else {
        println!("{what} sent {id}");
    }
    Ok(())
}

/// Prints what came back for a SCHEDULE/UNSCHEDULE; a refusal is an error
/// (exit status 1). No answer is not: EventMQ's router and scheduler never
/// answer.
fn schedule_answer(cli: &Cli, what: &str, answer: ScheduleAnswer) -> anyhow::Result<()> {
    let (status, msgid, detail) = match &answer {
        ScheduleAnswer::Accepted { msgid, detail } => ("accepted", msgid, detail.clone()),
        ScheduleAnswer::Refused { msgid, code, text } => ("refused", msgid, format!("{code} {text}")),
        ScheduleAnswer::Unconfirmed { msgid } => {
            ("unconfirmed", msgid, "no answer in time (an EventMQ router or scheduler never answers)".into())
        }
    };
    let id = String::from_utf8_lossy(msgid);
    if cli.json {
        let detail = serde_json::from_str::<Value>(&detail).unwrap_or(Value::String(detail.clone()));
        println!("{}", serde_json::json!({"status": status, "msgid": id, "detail": detail}));
    } else {
        println!("{what} {status} {id} {detail}");
    }
    match answer {
        ScheduleAnswer::Refused { .. } => Err(anyhow!("{what} {id} refused: {detail}")),
        _ => Ok(()),
    }
}

fn build_body(b: &BodyArgs) -> anyhow::Result<Vec<u8>> {
    let call = match (&b.body, &b.callable, &b.path) {
        (Some(raw), None, None) => return Ok(raw.clone().into_bytes()),
        (None, Some(c), Some(p)) => PythonCall::new(p, c),
        (None, Some(c), None) => PythonCall::from_dotted(c)
            .ok_or_else(|| anyhow!("--callable {c:?} needs a dot (module.function) or --path"))?,
        (None, None, _) => return Err(anyhow!("give a body or --callable")),
        _ => return Err(anyhow!("give either a raw body or --callable/--path, not both")),
    };
    let args: Value = serde_json::from_str(&b.args).context("--args is not JSON")?;
    let kwargs: Value = serde_json::from_str(&b.kwargs).context("--kwargs is not JSON")?;
    let args = args.as_array().cloned().ok_or_else(|| anyhow!("--args must be a JSON array"))?;
    let kwargs = kwargs.as_object().cloned().ok_or_else(|| anyhow!("--kwargs must be a JSON object"))?;
    Ok(call.args(args).kwargs(kwargs).body())
}

fn request(cli: &Cli, queue: &str, body: &[u8], headers: &str) -> anyhow::Result<()> {
    let mut client = Client::connect(&cli.frontend)?.with_timeout(*cli.timeout);
    let outcome = client.request(queue, headers, body)?;
    let (status, msgid, detail) = match &outcome {
        Outcome::Accepted { msgid } => ("accepted", msgid, String::new()),
        Outcome::Rejected { msgid, code, text } => ("rejected", msgid, format!("{code} {text}")),
        Outcome::Unknown { msgid } => {
            ("unknown", msgid, "no answer in time (an EventMQ router answers only immediate dispatches)".into())
        }
    };
    let id = String::from_utf8_lossy(msgid);
    if cli.json {
        println!("{}", serde_json::json!({"status": status, "msgid": id, "detail": detail}));
    } else {
        println!("{status} {id} {detail}");
    }
    match outcome {
        Outcome::Rejected { .. } => Err(anyhow!("request {id} rejected: {detail}")),
        _ => Ok(()),
    }
}
