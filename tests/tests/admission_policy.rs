//! The manifests shipped for per-GPU fencing (packaging/kubernetes): the
//! ValidatingAdmissionPolicy's CEL expressions evaluated as the API server would, against
//! two node identities and an admin, and the RBAC that lets the agent make its calls.

use std::path::PathBuf;

use cel::{Context, Program};
use serde::Deserialize;
use serde_json::{json, Value};

fn manifest(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("manifest");
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML document"))
        .collect()
}

fn policy() -> Value {
    manifest("device-taints-admission.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy")
}

fn eval(expression: &str, request: &Value, object: &Value, old: &Value) -> Result<bool, String> {
    let program = Program::compile(expression).map_err(|e| format!("{expression}: {e}"))?;
    let mut ctx = Context::default();
    ctx.add_variable("request", request.clone())
        .map_err(|e| e.to_string())?;
    ctx.add_variable("object", object.clone())
        .map_err(|e| e.to_string())?;
    ctx.add_variable("oldObject", old.clone())
        .map_err(|e| e.to_string())?;
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        other => Err(format!("{expression}: {other:?}")),
    }
}

/// Would the API server admit `operation` by `user` on a rule (`object` after, `old`
/// before)? As it decides: the policy applies only where every match condition holds; then
/// every validation must be true (an evaluation error fails, `failurePolicy: Fail`).
fn admitted(user: &str, operation: &str, object: &Value, old: &Value) -> bool {
    let p = policy();
    let request = json!({ "operation": operation, "userInfo": { "username": user, "groups": ["system:nodes"] } });
    let applies = p["spec"]["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .all(|c| {
            eval(
                c["expression"].as_str().expect("expression"),
                &request,
                object,
                old,
            )
            .expect("a match condition evaluates")
        });
    if !applies {
        return true;
    }
    p["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .all(|v| {
            eval(
                v["expression"].as_str().expect("expression"),
                &request,
                object,
                old,
            )
            .unwrap_or(false)
        })
}

fn rule(pool: &str, device: Option<&str>, driver: &str) -> Value {
    let mut selector = json!({ "driver": driver, "pool": pool });
    if let Some(device) = device {
        selector["device"] = json!(device);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": { "name": format!("gpu-agent.{pool}.{}", device.unwrap_or("gpu-3")) },
        "spec": { "deviceSelector": selector, "taint": { "key": "gpu-agent.io/gpu-fault", "effect": "NoSchedule" } }
    })
}

#[test]
fn a_node_touches_only_rules_of_its_own_devices() {
    let (a, b) = (
        "system:node:ip-10-0-1-2.ec2.internal",
        "system:node:ip-10-0-9-9.ec2.internal",
    );
    let own = rule("ip-10-0-1-2.ec2.internal", Some("gpu-3"), "gpu.nvidia.com");
    let null = Value::Null;
    // Node A on its own GPU: create, update, delete.
    assert!(admitted(a, "CREATE", &own, &null));
    assert!(admitted(a, "UPDATE", &own, &own));
    assert!(admitted(a, "DELETE", &null, &own));
    // Node B on node A's GPU: refused every way, moving it into its own pool included.
    assert!(!admitted(b, "CREATE", &own, &null));
    assert!(!admitted(b, "DELETE", &null, &own));
    let moved = rule("ip-10-0-9-9.ec2.internal", Some("gpu-3"), "gpu.nvidia.com");
    assert!(
        !admitted(b, "UPDATE", &moved, &own),
        "taking over another node's rule"
    );
    assert!(!admitted(a, "UPDATE", &moved, &own), "giving a rule away");
    // Its own pool, but another driver's devices, or the whole pool.
    assert!(!admitted(
        a,
        "CREATE",
        &rule(
            "ip-10-0-1-2.ec2.internal",
            Some("efa-0"),
            "efa.amazonaws.com"
        ),
        &null
    ));
    assert!(!admitted(
        a,
        "CREATE",
        &rule("ip-10-0-1-2.ec2.internal", None, "gpu.nvidia.com"),
        &null
    ));
    // No selector at all: the evaluation fails, and so does the request.
    assert!(!admitted(a, "CREATE", &json!({ "spec": {} }), &null));
    // Its own pool and device, under another node's rule name: squatting refused.
    let mut squat = rule("ip-10-0-9-9.ec2.internal", Some("gpu-3"), "gpu.nvidia.com");
    squat["metadata"]["name"] = json!("gpu-agent.ip-10-0-1-2.ec2.internal.gpu-3");
    assert!(
        !admitted(b, "CREATE", &squat, &null),
        "a rule name of another node"
    );
    let mut renamed = own.clone();
    renamed["metadata"]["name"] = json!("gpu-agent.ip-10-0-1-2.ec2.internal.gpu-4");
    assert!(
        !admitted(a, "CREATE", &renamed, &null),
        "a name that is not the device's"
    );
    // A name past 253 characters is hashed under gpu-agent.: admitted in its own pool.
    let long = "n".repeat(245);
    let mut hashed = rule(&long, Some("gpu-3"), "gpu.nvidia.com");
    hashed["metadata"]["name"] = json!("gpu-agent.0123456789abcdef");
    assert!(admitted(
        &format!("system:node:{long}"),
        "CREATE",
        &hashed,
        &null
    ));
    // An admin (not a node identity) is not matched.
    assert!(admitted(
        "kubernetes-admin",
        "CREATE",
        &rule("any", None, "other"),
        &null
    ));
}

#[test]
fn the_binding_denies_and_the_rbac_covers_the_agents_calls() {
    let docs = manifest("device-taints-admission.yaml");
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("binding");
    assert_eq!(binding["spec"]["policyName"], policy()["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy()["spec"]["failurePolicy"], "Fail");

    let rbac = manifest("device-taints-rbac.yaml");
    let role = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("role");
    let allows = |resource: &str, verb: &str| {
        role["rules"].as_array().expect("rules").iter().any(|r| {
            r["apiGroups"] == json!(["resource.k8s.io"])
                && r["resources"]
                    .as_array()
                    .is_some_and(|x| x.contains(&json!(resource)))
                && r["verbs"]
                    .as_array()
                    .is_some_and(|x| x.contains(&json!(verb)))
        })
    };
    for verb in ["get", "list", "create", "patch", "delete"] {
        assert!(allows("devicetaintrules", verb), "{verb}");
    }
    assert!(allows("resourceslices", "list"));
    assert!(
        !allows("resourceslices", "create"),
        "never writes the driver's slices"
    );
    let bound = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .expect("binding");
    assert_eq!(bound["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(bound["subjects"][0]["name"], "system:nodes");
}
