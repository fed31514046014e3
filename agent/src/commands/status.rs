//! `gpu-agent status`: ask the running daemon.

use anyhow::Context;

use super::EXIT_UNREACHABLE;
use crate::config::Loaded;
use crate::sinks::status::{query, render, Request, Response};

/// Print the daemon's health; exit 0 healthy, 1 warning or fatal, 2 unreachable.
pub fn status(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let runtime = super::runtime().context("cannot start the async runtime")?;
    let socket = &loaded.config.status.socket;
    match runtime.block_on(query(socket, &Request::Status)) {
        Ok(Response::Status { snapshot }) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&snapshot).context("cannot encode JSON")?
                );
            } else {
                print!("{}", render(&snapshot));
            }
            Ok(u8::try_from(snapshot.health.exit_code()).unwrap_or(1))
        }
        Ok(Response::Error { message }) => {
            eprintln!("gpu-agent: the daemon refused the request: {message}");
            Ok(EXIT_UNREACHABLE)
        }
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            Ok(EXIT_UNREACHABLE)
        }
    }
}
