//! The test CSI driver as its own process, for benchmarks and manual runs
//! of `health-controller` against a driver in another process (as a
//! real driver is, beside its sidecars).
//!
//! ```text
//! csi-test-driver --dir DIR [--name NAME] [--mode modern|legacy|legacy-no-condition|hang|unimplemented] [--volumes N]
//!                 [--unimplemented RPC[,RPC...]] [--node-caps CAP[,CAP...]] [--controller-caps CAP[,CAP...]]
//! ```
//!
//! `--unimplemented` makes the named RPCs (names as `calls` prints them)
//! answer UNIMPLEMENTED whatever the mode, and stops advertising their
//! capabilities: `--unimplemented ControllerListVolumeHealth,ListVolumes` is
//! a driver without any health list, which a controller must ask one volume
//! at a time.
//!
//! `--node-caps` and `--controller-caps` set exactly what NodeGetCapabilities
//! and ControllerGetCapabilities advertise, by the spec's enum names
//! (`GET_VOLUME_HEALTH,GET_STORAGE_HEALTH`; an empty list advertises
//! nothing), whatever the mode serves: with `--unimplemented` they make a
//! driver that advertises an RPC it does not serve.
//!
//! Serves Identity, Node and Controller on `DIR/csi.sock` with `N` healthy
//! volumes named `vol-000000`, `vol-000001`, ..., prints `ready <socket>`
//! on stdout, then takes one command per line on stdin and answers each
//! with one line:
//!
//! ```text
//! health <volume> <Inaccessible|DataLoss|Degraded> <Reason> <message...>   -> ok
//! healthy <volume>                                                      -> ok
//! remove <volume>                                                       -> ok
//! calls                                                                 -> {"ListVolumes":3,...}
//! quit                                                                  -> (exits)
//! ```
//!
//! A malformed command answers `error: ...` and the driver keeps serving;
//! end of input stops it.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use health_csi::testing::{
    ControllerCapability, DriverMode, NodeCapability, Rpc, TestDriver, TestDriverHandle,
};
use health_csi::{HealthEntry, HealthStatus};

struct Args {
    dir: PathBuf,
    name: Option<String>,
    mode: DriverMode,
    volumes: usize,
    unimplemented: Vec<Rpc>,
    node_caps: Option<Vec<NodeCapability>>,
    controller_caps: Option<Vec<ControllerCapability>>,
}

fn usage() -> String {
    "usage: csi-test-driver --dir DIR [--name NAME] [--mode modern|legacy|legacy-no-condition|hang|unimplemented] [--volumes N] [--unimplemented RPC[,RPC...]] [--node-caps CAP[,CAP...]] [--controller-caps CAP[,CAP...]]".to_string()
}

/// A comma-separated list of capability names, each parsed by `parse`
/// (the generated enums' `from_str_name`: the spec's own spelling).
fn capabilities<T: std::fmt::Debug>(
    flag: &str,
    list: &str,
    parse: fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    list.split(',')
        .filter(|name| !name.is_empty())
        .map(|name| parse(name).ok_or_else(|| format!("{flag}: unknown capability {name:?}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut name = None;
    let mut mode = DriverMode::Modern;
    let mut volumes = 0usize;
    let mut unimplemented = Vec::new();
    let mut node_caps = None;
    let mut controller_caps = None;
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))
        };
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--name" => name = Some(value()?),
            "--mode" => {
                mode = match value()?.as_str() {
                    "modern" => DriverMode::Modern,
                    "legacy" => DriverMode::LegacyOnly,
                    "legacy-no-condition" => DriverMode::LegacyNoCondition,
                    "hang" => DriverMode::Hang,
                    "unimplemented" => DriverMode::Unimplemented,
                    other => return Err(format!("unknown mode {other:?}\n{}", usage())),
                }
            }
            "--volumes" => {
                let v = value()?;
                volumes = v
                    .parse()
                    .map_err(|_| format!("--volumes {v:?} is not a number"))?;
            }
            "--unimplemented" => {
                for name in value()?.split(',').filter(|n| !n.is_empty()) {
                    unimplemented.push(rpc_named(name)?);
                }
            }
            "--node-caps" => {
                node_caps = Some(capabilities(
                    "--node-caps",
                    &value()?,
                    NodeCapability::from_str_name,
                )?);
            }
            "--controller-caps" => {
                controller_caps = Some(capabilities(
                    "--controller-caps",
                    &value()?,
                    ControllerCapability::from_str_name,
                )?);
            }
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    let dir = dir.ok_or_else(usage)?;
    Ok(Args {
        dir,
        name,
        mode,
        volumes,
        unimplemented,
        node_caps,
        controller_caps,
    })
}

/// The RPC `calls` names `name`.
fn rpc_named(name: &str) -> Result<Rpc, String> {
    Rpc::ALL
        .iter()
        .copied()
        .find(|rpc| format!("{rpc:?}") == name)
        .ok_or_else(|| {
            let known: Vec<String> = Rpc::ALL.iter().map(|rpc| format!("{rpc:?}")).collect();
            format!("unknown RPC {name:?}; one of {}", known.join(", "))
        })
}

/// The name of the `i`-th volume the driver starts with.
fn volume_id(i: usize) -> String {
    format!("vol-{i:06}")
}

fn status(word: &str) -> Result<HealthStatus, String> {
    match word {
        "Inaccessible" => Ok(HealthStatus::Inaccessible),
        "DataLoss" => Ok(HealthStatus::DataLoss),
        "Degraded" => Ok(HealthStatus::Degraded),
        other => Err(format!("unknown status {other:?}")),
    }
}

/// Carries out one stdin command; `Ok(None)` means quit.
fn command(driver: &TestDriverHandle, line: &str) -> Result<Option<String>, String> {
    let mut words = line.split_whitespace();
    match words.next() {
        Some("health") => {
            let (Some(volume), Some(s), Some(reason)) = (words.next(), words.next(), words.next())
            else {
                return Err("usage: health <volume> <status> <Reason> <message...>".into());
            };
            let message = words.collect::<Vec<_>>().join(" ");
            let entry = HealthEntry {
                status: status(s)?,
                reason: reason.to_string(),
                message,
            };
            driver.set_volume_health(volume, vec![entry]);
            Ok(Some("ok".into()))
        }
        Some("healthy") => {
            let volume = words.next().ok_or("usage: healthy <volume>")?;
            driver.set_volume_health(volume, Vec::new());
            Ok(Some("ok".into()))
        }
        Some("remove") => {
            let volume = words.next().ok_or("usage: remove <volume>")?;
            driver.remove_volume(volume);
            Ok(Some("ok".into()))
        }
        Some("calls") => {
            let counts: serde_json::Map<String, serde_json::Value> = Rpc::ALL
                .iter()
                .map(|rpc| (format!("{rpc:?}"), driver.calls(*rpc).into()))
                .collect();
            Ok(Some(serde_json::Value::Object(counts).to_string()))
        }
        Some("quit") => Ok(None),
        Some(other) => Err(format!("unknown command {other:?}")),
        None => Err("empty command".into()),
    }
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("csi-test-driver: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let started = runtime.block_on(async {
        match &args.name {
            Some(name) => TestDriver::start_named(&args.dir, name, args.mode).await,
            None => TestDriver::start(&args.dir, args.mode).await,
        }
    });
    let driver = match started {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "csi-test-driver: serving on {}: {e}",
                args.dir.join("csi.sock").display()
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    for rpc in &args.unimplemented {
        driver.set_unimplemented(*rpc);
    }
    if let Some(caps) = args.node_caps {
        driver.set_node_capabilities(caps);
    }
    if let Some(caps) = args.controller_caps {
        driver.set_controller_capabilities(caps);
    }
    for i in 0..args.volumes {
        driver.set_volume_health(&volume_id(i), Vec::new());
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if writeln!(out, "ready {}", driver.socket_path().display())
        .and_then(|()| out.flush())
        .is_err()
    {
        return std::process::ExitCode::FAILURE;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer = match command(&driver, &line) {
            Ok(Some(answer)) => answer,
            Ok(None) => break,
            Err(e) => format!("error: {e}"),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    // No graceful shutdown: it would wait for clients to hang up, and a
    // client that outlives the driver (the point of some tests) never does.
    drop(driver);
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::ExitCode::SUCCESS
}
