//! Memory quantities in the kubelet's binary-suffix form (`100Mi`, `2Gi`), kept in MiB.

/// Parse `512Ki`, `100Mi`, `2Gi`, `1Ti` or plain bytes into MiB (rounded up).
pub fn parse_mib(text: &str) -> Option<u64> {
    let t = text.trim();
    let (number, factor_kib) = if let Some(n) = t.strip_suffix("Ki") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix("Mi") {
        (n, 1024)
    } else if let Some(n) = t.strip_suffix("Gi") {
        (n, 1024 * 1024)
    } else if let Some(n) = t.strip_suffix("Ti") {
        (n, 1024 * 1024 * 1024)
    } else {
        let bytes: u64 = t.parse().ok()?;
        return Some(bytes.div_ceil(1024 * 1024));
    };
    let value: u64 = number.parse().ok()?;
    Some((value.checked_mul(factor_kib)?).div_ceil(1024))
}

/// Format MiB the way the kubelet prints it.
pub fn format_mib(mib: u64) -> String {
    if mib > 0 && mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_mib("100Mi"), Some(100));
        assert_eq!(parse_mib("2Gi"), Some(2048));
        assert_eq!(parse_mib("1536Ki"), Some(2));
        assert_eq!(parse_mib("1048576"), Some(1));
        assert_eq!(parse_mib("x"), None);
        assert_eq!(format_mib(2048), "2Gi");
        assert_eq!(format_mib(1465), "1465Mi");
    }
}
