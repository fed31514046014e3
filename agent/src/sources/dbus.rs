//! The D-Bus connection the logind and IMEX sources share the way of making: the configured
//! bus address (a test's private bus), else the system bus.

/// Connect to `address`, or the system bus where it is `None`.
pub async fn connect(address: Option<&str>) -> zbus::Result<zbus::Connection> {
    match address {
        Some(address) => zbus::connection::Builder::address(address)?.build().await,
        None => zbus::Connection::system().await,
    }
}
