//! Shutdown as an argument: every long-running task takes a [`Shutdown`] and returns soon
//! after it fires.

use tokio::sync::watch;

/// Fires shutdown for every [`Shutdown`] cloned from it.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

/// Waits for shutdown.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A connected trigger and listener.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Tell every listener to stop.
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// Resolves once shutdown has been fired (or the trigger dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}
