//! `gpu-agent`: the binary's edge. Parses the command line, loads the config, runs the
//! subcommand and maps failures to documented exit codes:
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success / healthy |
//! | 1 | `status`/`check`: a warning or fatal fault is present |
//! | 2 | `status`: daemon unreachable; `check`: kernel log unreadable |
//! | 64 | bad command line |
//! | 70 | internal error |
//! | 78 | bad config |

use std::process::ExitCode;

use clap::Parser;

use gpu_agent::cli::{Cli, Command};
use gpu_agent::commands;
use gpu_agent::config::{self, ConfigError};

const EXIT_USAGE: u8 = 64;
const EXIT_SOFTWARE: u8 = 70;
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    // kube's and the EC2 client's TLS is rustls on ring, the one provider linked; installed
    // once for the whole process, so no client's first handshake depends on rustls picking
    // it from crate features (which fails the day a dependency links a second provider).
    let _ = rustls::crypto::ring::default_provider().install_default();
    gpu_agent::logging::init(match cli.command {
        Command::Run => "info",
        _ => "warn",
    });
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("gpu-agent: {e:#}");
            ExitCode::from(if e.downcast_ref::<ConfigError>().is_some() {
                EXIT_CONFIG
            } else {
                EXIT_SOFTWARE
            })
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Xid(args) => return Ok(commands::xid::explain(args.code, args.sxid)),
        Command::DefaultConfig => {
            print!("{}", config::DEFAULT_TOML);
            return Ok(0);
        }
        _ => {}
    }
    let loaded = config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Run => commands::run::run(loaded),
        Command::Status(args) => commands::status::status(&loaded, args.json),
        Command::Check(args) => commands::check::check(&loaded, args.json),
        Command::Inject { what } => commands::inject::inject(&loaded, &what),
        Command::Drill {
            what: gpu_agent::cli::Drill::Checkpoint { dry_run },
        } => commands::drill::checkpoint(&loaded, dry_run),
        Command::KubeletConfig { action } => commands::kubelet_config::run(&loaded, &action),
        Command::Clear(args) => {
            commands::status::clear(&loaded, args.selector.filter(|_| !args.all))
        }
        Command::Xid(_) | Command::DefaultConfig => Ok(0),
    }
}
