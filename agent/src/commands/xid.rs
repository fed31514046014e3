//! `gpu-agent xid CODE`: explain a code from the catalog.

use crate::catalog::{self, DriverBranch, XID_OVERRIDES};

/// Print what NVIDIA says about a code and what the agent does about it. Exit 0 if the code
/// is in the catalog, 1 if not.
pub fn explain(code: u32, sxid: bool) -> u8 {
    if sxid {
        let class = catalog::classify_sxid(code, None);
        println!("SXid {code}: {}", class.name);
        println!("  {}", class.description);
        println!(
            "  agent: severity {}, action {}",
            class.severity, class.action
        );
        println!("  A line that says \"Fatal\" is treated as fatal whatever the table says.");
        return u8::from(catalog::sxid_entry(code).is_none());
    }
    let class = catalog::classify_xid(code, "", DriverBranch::Unknown);
    println!("Xid {code}: {}", class.name);
    println!("  {}", class.description);
    if !class.nvidia_action.is_empty() {
        println!("  NVIDIA's immediate action: {}", class.nvidia_action);
    }
    println!(
        "  agent: severity {}, action {}",
        class.severity, class.action
    );
    if let Some(o) = XID_OVERRIDES.iter().find(|o| o.code == code) {
        println!("  why: {}", o.why);
    }
    match code {
        144..=150 => println!(
            "  NVLink5 lines are decoded from their registers; the action depends on the line."
        ),
        154 => println!("  The line names the new recovery action; the agent follows it."),
        _ => {}
    }
    u8::from(catalog::xid_entry(code).is_none())
}
