//! `emq-bench`: load generator for eMQP and text-protocol brokers, with a
//! zero-logic baseline, HdrHistogram output and SVG plots (project issue 6).

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Subcommand};
use emq::bench::baseline::Wire;
use emq::bench::body::Tally;
use emq::bench::emqp::Target;
use emq::bench::report::{self, Record};
use emq::bench::run::{with_progress, with_progress_to, RunResult};
use emq::bench::{baseline, beanstalk, emqp, idle, jetstream, plot, text, BenchError, LoadSettings};
use emq::client::text::TextClientOptions;
use emq::config::{self, addr, BenchSettings, ConfigArgs, RawBenchConfig};
use emq::curve::ClientCurve;
use emq::program::output as out;

/// Load generator for eMQP and text-protocol brokers (emq, EventMQ,
/// beanstalkd), with a zero-logic baseline, HdrHistogram output and plots.
#[derive(clap::Parser)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawBenchConfig,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(clap::Args, serde::Serialize)]
struct Output {
    /// Directory for the JSON record, .hgrm files and SVG plot.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// File stem of this invocation's outputs.
    #[arg(long, default_value = "run")]
    name: String,
}

/// The broker's process, for its CPU time per job, and the servers it
/// stores jobs on.
#[derive(clap::Args, Clone, Default)]
struct BrokerPid {
    /// The broker's process: its CPU time (user + system, from
    /// `/proc/<pid>/stat`) over the run is reported per job received.
    #[arg(long)]
    pid: Option<u32>,
    /// With `--pid`: processes the broker stores jobs on (the nats-servers
    /// of `durability = "replicated"`), comma-separated: their CPU time
    /// over the run together is reported per job received
    /// (`server_cpu_s`, `server_cpu_us_per_job`).
    #[arg(long, value_delimiter = ',', requires = "pid")]
    server_pids: Vec<u32>,
}

/// The options of the line-protocol modes (text, beanstalk).
#[derive(clap::Args)]
struct LineArgs {
    /// The broker's address, `HOST:PORT`; several brokers (router names,
    /// docs/scaleout.md) separated by `;`: producer i sends to broker i mod
    /// N (`--clients` at least N), every consumer asks each broker on a
    /// connection of its own (`--workers` consumers per broker). Of a
    /// name's addresses separated by `,` the first is used.
    #[arg(long, value_parser = addr::text_owners_arg)]
    addr: String,
    #[command(flatten)]
    broker: BrokerPid,
    /// Producers only: pipelined submission, `--batch` jobs per write, at
    /// most `--in-flight` unacknowledged per producer; throughput is jobs
    /// stored per second.
    #[arg(long)]
    pipeline: bool,
    #[command(flatten)]
    load: LoadSettings,
    #[command(flatten)]
    output: Output,
}

/// What `emq-bench forwarder --help` says after its options (kept out of
/// the command's long about, whose format would put a blank line with
/// trailing spaces above each option's default).
const FORWARDER_HELP: &str = "One thread forwards (ROUTER frontend, ROUTER backend): no queues by name, no durability, no shards, no heartbeats of its own. It answers a worker's INFORM with ACK and keeps a FIFO of READY credits. With `--wire one` (the default) each client REQUEST is forwarded unchanged to the worker of the oldest credit, one message per job, no acceptance REPLY: the cost of ZeroMQ alone. With `--wire emqp` it exchanges the five messages an eMQP job costs emq-router: the client's REQUEST in, the acceptance REPLY out (a fresh msgid, frame 4 the REQUEST's msgid), the job out to a worker with a free slot (`reply-requested` added to its headers; REQUESTs wait in a FIFO while no worker has one), the worker's job-result REPLY in and its READY in: a fair ceiling for emq-router under the same load.\n\nPrints `frontend=<endpoint> backend=<endpoint>` once bound, and at exit what it counted: `requests=N accepted=N forwarded=N results=N readies=N dropped=N` (REQUESTs received, acceptance REPLYs sent, jobs sent to workers, job-result REPLYs and READYs received, messages dropped).";

/// What `emq-bench jetstream --help` says after its options.
const JETSTREAM_HELP: &str = "Reported: the table's row (sent = published, recvd = consumed, jobs/s, and the PubAck latency: each job's first try to its PubAck), then `<target>: {json}` with every figure: published, consumed, lost, redelivered, publish_retries (by cause), publish_msgs_per_s, puback_us (p50, p90, p99, p999, max), consume_msgs_per_s, jobs_per_s, delivery_us (concurrent: first try to delivery), client_cpu_us_per_job and, with --server-pids, server_cpu_us_per_job (sequential runs also per phase: _publish, _consume). With --concurrent (the default) jobs/s is jobs over the time from the first publish to the stream found empty; with --concurrent false, over the publish time plus the consume time. A transient publish error (PubAck timeout, no responders, broken connection) is retried with the same message id after 50 ms doubling to 1 s; a job still failing after 60 s, an unreachable server or a stream that cannot be created ends the run with exit status 2.";

#[derive(Subcommand)]
enum Cmd {
    /// eMQP clients and workers against a broker's frontend and backend.
    Emqp {
        /// The broker's frontend (clients); several separated by commas to
        /// follow a failover; several owners (router names) separated by
        /// `;`: each client then sends its REQUESTs round-robin over them.
        #[arg(long, value_parser = owners_arg)]
        frontend: String,
        /// The broker's backend (workers), as `--frontend`: the same owners
        /// in the same order; the workers are split over the owners
        /// (worker i serves owner i mod owners).
        #[arg(long, value_parser = owners_arg)]
        backend: String,
        /// Label of the target in reports (`emq`, `python`, …).
        #[arg(long, default_value = "emq")]
        target_name: String,
        /// Also run the same load against the in-process zero-logic
        /// forwarder (reported as `baseline`, or `baseline-emqp` with
        /// `--wire emqp`).
        #[arg(long)]
        compare_baseline: bool,
        /// With `--compare-baseline`: the forwarder's wire, `one` or `emqp`
        /// (see `emq-bench forwarder --help`).
        #[arg(long, value_enum, default_value_t = Wire::One, hide_possible_values = true)]
        wire: Wire,
        #[command(flatten)]
        broker: BrokerPid,
        #[command(flatten)]
        load: LoadSettings,
        #[command(flatten)]
        output: Output,
    },
    /// The same eMQP load against the in-process zero-logic forwarder only
    /// (reported as `baseline`, or `baseline-emqp` with `--wire emqp`).
    Baseline {
        /// The forwarder's wire, `one` or `emqp` (see `emq-bench forwarder
        /// --help`).
        #[arg(long, value_enum, default_value_t = Wire::One, hide_possible_values = true)]
        wire: Wire,
        #[command(flatten)]
        load: LoadSettings,
        #[command(flatten)]
        output: Output,
    },
    /// Runs the zero-logic baseline forwarder as a process of its own (so
    /// its CPU per job can be read like a broker's), until SIGTERM, SIGINT or
    /// SIGHUP.
    #[command(after_help = FORWARDER_HELP)]
    Forwarder {
        /// Which messages it exchanges per job: `one` or `emqp`.
        #[arg(long, value_enum, default_value_t = Wire::One, hide_possible_values = true)]
        wire: Wire,
        /// Frontend endpoint (clients); port `*` picks a free one.
        #[arg(long, default_value = "tcp://127.0.0.1:*", value_parser = addr::emqp_arg)]
        frontend_addr: String,
        /// Backend endpoint (workers); port `*` picks a free one.
        #[arg(long, default_value = "tcp://127.0.0.1:*", value_parser = addr::emqp_arg)]
        backend_addr: String,
    },
    /// Text-protocol producers (`--clients`, SCHED) and consumers (`--workers`, ASK/ACK).
    Text {
        /// Label of the target in reports.
        #[arg(long, default_value = "text")]
        target_name: String,
        #[command(flatten)]
        line: LineArgs,
    },
    /// The text mode's load in beanstalkd's protocol: producers (`--clients`,
    /// put) and consumers (`--workers`, reserve-with-timeout 0/delete).
    Beanstalk {
        /// Label of the target in reports.
        #[arg(long, default_value = "beanstalkd")]
        target_name: String,
        #[command(flatten)]
        line: LineArgs,
    },
    /// Many idle workers that only heartbeat; reports the broker's CPU.
    Idle {
        /// Label of the target in reports.
        #[arg(long, default_value = "emq")]
        target_name: String,
        #[command(flatten)]
        settings: idle::IdleSettings,
        #[command(flatten)]
        output: Output,
    },
    /// Fills one queue with N jobs and reports the broker's resident memory
    /// per queued job (`--pid`).
    Fill {
        #[command(flatten)]
        settings: emq::bench::fill::FillSettings,
    },
    /// The raw JetStream per-message baseline: one message per job on a
    /// fresh WorkQueue stream of a NATS JetStream cluster, published with
    /// `--in-flight` PubAcks awaited, consumed by a durable pull consumer
    /// and acked, until the stream is empty; the stream is deleted at the
    /// end. Exits with status 2 when the cluster cannot be used.
    #[command(after_help = JETSTREAM_HELP)]
    Jetstream {
        #[command(flatten)]
        settings: jetstream::JetStreamSettings,
        #[command(flatten)]
        output: Output,
    },
    /// Overlays `.hgrm` files in one SVG.
    Plot {
        /// The .hgrm files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The SVG to write.
        #[arg(short, long, default_value = "latency.svg")]
        output: PathBuf,
        /// Plot title.
        #[arg(long, default_value = "latency by percentile")]
        title: String,
    },
}

/// `--frontend`/`--backend` of the `emqp` mode: owners separated by `;`,
/// the addresses of one owner by `,` (`addr::emqp_owners`), written back
/// normalised; a list of one owner comes out as `addr::emqp_list_arg`
/// gives it.
fn owners_arg(given: &str) -> Result<String, addr::AddrError> {
    let owners = addr::emqp_owners(given)?;
    Ok(owners.iter().map(|o| o.join(",")).collect::<Vec<_>>().join(";"))
}

/// The `emqp` mode's CURVE keys from `curve_key_file` and
/// `curve_server_key` (as emq-worker takes them); `None` when neither is
/// set. Several server keys must match the frontend and the backend lists
/// one for one.
fn emqp_curve(settings: &BenchSettings, frontend: &str, backend: &str) -> anyhow::Result<Option<ClientCurve>> {
    let (fe, be) = (addr::emqp_list(frontend)?.len(), addr::emqp_list(backend)?.len());
    let curve =
        ClientCurve::from_settings(settings.curve_key_file.as_deref(), settings.curve_server_key.as_deref(), fe)?;
    if let Some(c) = curve.as_ref().filter(|c| c.server_keys.len() != 1 && c.server_keys.len() != be) {
        anyhow::bail!(
            "curve_server_key: {} keys for {be} backend addresses; give one for all or one per address",
            c.server_keys.len()
        );
    }
    Ok(curve)
}

/// The first address of an `--addr` list (the TLS server name comes from
/// its host unless `tls_server_name` is set: the same for every owner).
fn first_addr(list: &str) -> &str {
    list.split([';', ',']).next().unwrap_or(list).trim()
}

/// The `text` mode's TLS and token from `tls_ca`, `tls_server_name`,
/// `tls_cert`/`tls_key` and `token_file` (as emq-cli takes them).
fn text_link(settings: &BenchSettings, addr: &str) -> anyhow::Result<TextClientOptions> {
    if settings.tls_cert.is_some() != settings.tls_key.is_some() {
        anyhow::bail!("tls_cert and tls_key go together");
    }
    let cert_key = settings.tls_cert.as_deref().zip(settings.tls_key.as_deref());
    emq::client::text_tls::options(
        addr,
        settings.tls_ca.as_deref(),
        settings.tls_server_name.as_deref(),
        cert_key,
        settings.token_file.as_deref(),
    )
    .map_err(|e| anyhow::anyhow!(e))
}

fn emqp_run(name: &str, target: &Target, load: &LoadSettings, broker: &BrokerPid) -> anyhow::Result<RunResult> {
    measured(name, load, broker, |p| emqp::run(target, load, p))
}

/// Runs `load_fn` and, with `--pid`, puts the broker's CPU per job received
/// (warm-up included) into the result's `extra`, with the load generator's
/// own (this process), the `--server-pids`' together and the run's wall
/// time, so the cores each kept busy can be told (CPU seconds / `wall_s`).
fn measured(
    name: &str,
    load: &LoadSettings,
    broker: &BrokerPid,
    load_fn: impl FnOnce(Arc<AtomicU64>) -> Result<Tally, BenchError>,
) -> anyhow::Result<RunResult> {
    let servers_cpu = || broker.server_pids.iter().map(|&p| idle::cpu_seconds(p)).sum::<Result<f64, _>>();
    let cpu0 = broker.pid.map(idle::cpu_seconds).transpose()?;
    let own0 = broker.pid.map(|_| idle::cpu_seconds(std::process::id())).transpose()?;
    let servers0 = servers_cpu()?;
    let started = std::time::Instant::now();
    let tally = with_progress(name, load, load_fn)?;
    let wall = started.elapsed().as_secs_f64();
    let mut result = RunResult::from_tally(name, &tally);
    if let (Some(pid), Some(c0), Some(o0)) = (broker.pid, cpu0, own0) {
        let jobs = tally.received_all.max(1) as f64;
        let cpu = idle::cpu_seconds(pid)? - c0;
        let own = idle::cpu_seconds(std::process::id())? - o0;
        let mut extra = serde_json::json!({
            "broker_cpu_s": cpu,
            "broker_cpu_us_per_job": cpu / jobs * 1e6,
            "bench_cpu_s": own,
            "bench_cpu_us_per_job": own / jobs * 1e6,
            "wall_s": wall,
        });
        if tally.producer_cpu_ns > 0 {
            // The eMQP client threads alone (what spreading over owners costs a producer).
            extra["producer_cpu_us_per_job"] = (tally.producer_cpu_ns as f64 / 1e3 / jobs).into();
        }
        if !broker.server_pids.is_empty() {
            let servers = servers_cpu()? - servers0;
            extra["server_cpu_s"] = servers.into();
            extra["server_cpu_us_per_job"] = (servers / jobs * 1e6).into();
        }
        result.extra = Some(extra);
    }
    Ok(result)
}

/// The load against a fresh in-process forwarder of `wire`; prints what
/// the forwarder counted.
fn baseline_run(load: &LoadSettings, wire: Wire) -> anyhow::Result<RunResult> {
    let fwd = baseline::Forwarder::start(wire)?;
    let result = emqp_run(wire.baseline_name(), &fwd.target, load, &BrokerPid::default())?;
    out(format_args!("{} forwarder: {}\n", wire.baseline_name(), fwd.stop()))?;
    Ok(result)
}

type LineLoad = fn(&str, &LoadSettings, Arc<AtomicU64>, &TextClientOptions) -> Result<Tally, BenchError>;

/// A line protocol's two loads: consumers and producers, and pipelined
/// producers only.
struct LineLoads {
    full: LineLoad,
    pipeline: LineLoad,
}

/// A text or beanstalk run; with `--pid`, the broker's CPU per job received
/// (warm-up included) goes into the result's `extra`.
fn line_run(mode: &str, name: &str, a: &LineArgs, loads: LineLoads, link: &TextClientOptions) -> anyhow::Result<()> {
    let load = if a.pipeline { loads.pipeline } else { loads.full };
    let result = measured(name, &a.load, &a.broker, |p| load(&a.addr, &a.load, p, link))?;
    let settings = settings_json(
        &a.load,
        serde_json::json!({"addr": a.addr, "pid": a.broker.pid,
        "server_pids": a.broker.server_pids, "pipeline": a.pipeline,
        "tls": link.tls.is_some(), "token": link.token.is_some()}),
    );
    finish(mode, settings, vec![result], &a.output)
}

fn finish(mode: &str, settings: serde_json::Value, results: Vec<RunResult>, output: &Output) -> anyhow::Result<()> {
    let mut ratios = serde_json::Map::new();
    let is_baseline = |r: &&RunResult| r.target.starts_with("baseline");
    for b in results.iter().filter(is_baseline).filter(|b| b.throughput_per_s > 0.0) {
        for r in results.iter().filter(|r| !is_baseline(r)) {
            ratios.insert(format!("{}/{}", r.target, b.target), (r.throughput_per_s / b.throughput_per_s).into());
        }
    }
    out(format_args!("{}", report::table(&results)))?;
    for r in results.iter().filter_map(|r| r.extra.as_ref().map(|e| (&r.target, e))) {
        out(format_args!("{}: {}\n", r.0, r.1))?;
    }
    for (k, v) in &ratios {
        out(format_args!("throughput {k} = {:.3}\n", v.as_f64().unwrap_or(0.0)))?;
    }
    let record = Record { tool: "emq-bench", mode, machine: report::machine(), settings, results: &results, ratios };
    let written = report::write(&output.out, &output.name, &record)?;
    for p in written {
        out(format_args!("wrote {}\n", p.display()))?;
    }
    Ok(())
}

fn settings_json(load: &impl serde::Serialize, extra: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::to_value(load).unwrap_or_default();
    if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
    v
}

fn main_inner() -> anyhow::Result<()> {
    let matches = Cli::command().mut_args(|a| a.global(true)).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let Some(settings) = config::start(&cli.config, cli.raw)? else { return Ok(()) };
    let Some(cmd) = cli.cmd else { anyhow::bail!("give a mode, e.g. emq-bench emqp (see emq-bench --help)") };
    match cmd {
        Cmd::Emqp { frontend, backend, target_name, compare_baseline, wire, broker, load, output } => {
            let curve = emqp_curve(&settings, &frontend, &backend)?;
            let curved = curve.is_some();
            let target = Target { frontend: frontend.clone(), backend: backend.clone(), curve };
            let mut results = vec![emqp_run(&target_name, &target, &load, &broker)?];
            if compare_baseline {
                results.push(baseline_run(&load, wire)?);
            }
            let extra = serde_json::json!({"frontend": frontend, "backend": backend, "pid": broker.pid,
                "server_pids": broker.server_pids, "compare_baseline": compare_baseline, "wire": wire, "curve": curved});
            finish("emqp", settings_json(&load, extra), results, &output)
        }
        Cmd::Baseline { wire, load, output } => {
            let results = vec![baseline_run(&load, wire)?];
            finish("baseline", settings_json(&load, serde_json::json!({"wire": wire})), results, &output)
        }
        Cmd::Forwarder { wire, frontend_addr, backend_addr } => {
            let fwd = baseline::Forwarder::start_on(&frontend_addr, &backend_addr, wire)?;
            out(format_args!("frontend={} backend={}\n", fwd.target.frontend, fwd.target.backend))?;
            let mut signals = signal_hook::iterator::Signals::new(emq::program::stop_signals())?;
            let _ = signals.forever().next();
            out(format_args!("{}\n", fwd.stop()))
        }
        Cmd::Text { target_name, line } => {
            let link = text_link(&settings, first_addr(&line.addr))?;
            let loads = LineLoads { full: text::run_with, pipeline: text::pipeline_with };
            line_run("text", &target_name, &line, loads, &link)
        }
        Cmd::Beanstalk { target_name, line } => {
            if text_link(&settings, first_addr(&line.addr))?.tls.is_some() || settings.token_file.is_some() {
                anyhow::bail!("tls_ca and token_file apply to the text mode only (beanstalkd speaks neither)");
            }
            let loads = LineLoads {
                full: |a, s, p, _| beanstalk::run(a, s, p),
                pipeline: |a, s, p, _| beanstalk::pipeline(a, s, p),
            };
            line_run("beanstalk", &target_name, &line, loads, &TextClientOptions::default())
        }
        Cmd::Idle { target_name, settings, output } => {
            let mut result = idle::run(&settings, Arc::default())?;
            result.target = target_name;
            finish("idle", settings_json(&settings, serde_json::json!({})), vec![result], &output)
        }
        Cmd::Fill { settings } => {
            let r = emq::bench::fill::run(&settings)?;
            out(format_args!("{}\n", serde_json::to_string(&r)?))
        }
        Cmd::Jetstream { settings, output } => {
            let bound = Some(settings.jobs.saturating_mul(2));
            let name = settings.target_name.clone();
            let run = with_progress_to(&name, settings.no_progress, bound, |p| jetstream::run(&settings, p))?;
            let extra = serde_json::json!({"stream": run.stream});
            finish("jetstream", settings_json(&settings, extra), vec![run.result(&settings)], &output)
        }
        Cmd::Plot { files, output, title } => {
            let series = files.iter().map(|f| plot::Series::read(f)).collect::<Result<Vec<_>, _>>()?;
            plot::svg(&series, &title, &output)?;
            out(format_args!("wrote {}\n", output.display()))
        }
    }
}

/// The exit status of a run that could not use its NATS cluster (the
/// server unreachable, the stream not created, a publish failing for good).
const EXIT_NATS: i32 = 2;

fn main() {
    let result = main_inner();
    if let Some(e) = result.as_ref().err().filter(|e| matches!(e.downcast_ref(), Some(BenchError::Nats { .. }))) {
        let line = emq::program::error_line("emq-bench", e.as_ref());
        emq::program::diagnostic(format_args!("{}", emq::program::printable_lines(&line)));
        std::process::exit(EXIT_NATS);
    }
    emq::program::exit_on_error("emq-bench", result);
}
