//! A config file: every value is checked at load, and an error names the file and key.
#![no_main]

use gpu_agent::config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = config::parse(text, std::path::Path::new("/fuzz/config.toml")) {
        assert!(e.to_string().contains("/fuzz/config.toml"), "{e}");
    }
});
