//! `gpu-agent status`: ask the running daemon.

use anyhow::Context;

use super::EXIT_UNREACHABLE;
use crate::config::Loaded;
use crate::sinks::status::{query, Request, Response};

/// Print the daemon's health; exit 0 healthy, 1 warning or fatal, 2 unreachable.
pub fn status(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let runtime = super::runtime().context("cannot start the async runtime")?;
    let socket = &loaded.config.status.socket;
    match runtime.block_on(query(socket, &Request::Status)) {
        Ok(Response::Status { snapshot }) => {
            super::print_snapshot(&snapshot, json)?;
            Ok(u8::try_from(snapshot.health.exit_code()).unwrap_or(1))
        }
        Ok(Response::Error { message }) => {
            eprintln!("gpu-agent: the daemon refused the request: {message}");
            Ok(EXIT_UNREACHABLE)
        }
        Ok(Response::Cleared { .. }) => {
            eprintln!("gpu-agent: unexpected answer from the daemon");
            Ok(EXIT_UNREACHABLE)
        }
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            Ok(EXIT_UNREACHABLE)
        }
    }
}

/// `gpu-agent clear`: ask the daemon to drop faults an operator repaired. Exit 0 if any
/// were cleared, 1 if none matched, 2 if the daemon could not be asked.
pub fn clear(loaded: &Loaded, selector: Option<String>) -> anyhow::Result<u8> {
    let runtime = super::runtime().context("cannot start the async runtime")?;
    match runtime.block_on(query(
        &loaded.config.status.socket,
        &Request::Clear { selector },
    )) {
        Ok(Response::Cleared { faults }) if faults.is_empty() => {
            eprintln!("gpu-agent: no fault matched");
            Ok(1)
        }
        Ok(Response::Cleared { faults }) => {
            for f in faults {
                println!("cleared: {f}");
            }
            Ok(0)
        }
        Ok(Response::Error { message }) => {
            eprintln!("gpu-agent: {message}");
            Ok(EXIT_UNREACHABLE)
        }
        Ok(Response::Status { .. }) => {
            eprintln!("gpu-agent: unexpected answer from the daemon");
            Ok(EXIT_UNREACHABLE)
        }
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            Ok(EXIT_UNREACHABLE)
        }
    }
}
