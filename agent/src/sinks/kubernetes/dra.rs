//! The DRA calls of per-GPU fencing: which `resource.k8s.io` version serves
//! `DeviceTaintRule`, the NVIDIA DRA driver's ResourceSlices for this node, and the rules
//! themselves (cluster-scoped, untyped: k8s-openapi has no type for them yet). Each call is
//! time-limited like every other.

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use super::client::{timed, ApiError};

/// The API group of DRA.
pub const GROUP: &str = "resource.k8s.io";

/// The versions that serve `DeviceTaintRule` with the fields the agent writes (effect
/// `None` and `NoExecute`, `timeAdded`), preferred first. `v1alpha3` (<= 1.35) lacks effect
/// `None` and is not used.
pub const VERSIONS: [&str; 2] = ["v1", "v1beta2"];

/// The NVIDIA DRA driver's name.
pub const DRIVER: &str = "gpu.nvidia.com";

/// One device of a ResourceSlice, as fencing needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevice {
    /// Its name in the slice (`gpu-3`, `gpu-3-mig-1g12gb-19-0`).
    pub name: String,
    /// Its `uuid` attribute (`GPU-...`, `MIG-...`).
    pub uuid: Option<String>,
    /// Its `parentUUID` attribute (a MIG device's GPU).
    pub parent_uuid: Option<String>,
}

/// A DeviceTaintRule as the server holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRule {
    /// Its name.
    pub name: String,
    /// `spec.deviceSelector.pool`.
    pub pool: String,
    /// `spec.deviceSelector.device`.
    pub device: String,
    /// `spec.taint.effect`.
    pub effect: String,
    /// `spec.taint.value`.
    pub value: String,
    /// Its annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The uid of the Node that owns it (`metadata.ownerReferences`), if one does.
    pub owner_uid: Option<String>,
    /// The instance it was written for (label [`INSTANCE_LABEL`]), if it says.
    pub instance: Option<String>,
}

/// The Node a rule belongs to: garbage collection removes the rule with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOwner {
    /// The Node's name.
    pub name: String,
    /// Its uid: a Node deleted and created again under the same name (EKS names are
    /// recycled private IPs) has another.
    pub uid: String,
    /// The instance id from its `spec.providerID` (`aws:///us-west-2a/i-0abc...`), if set.
    pub instance: Option<String>,
}

/// The label naming the instance a rule was written for.
pub const INSTANCE_LABEL: &str = "gpu-agent.io/instance";

impl StoredRule {
    fn of(object: &DynamicObject) -> Self {
        let spec = &object.data["spec"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        Self {
            name: object.metadata.name.clone().unwrap_or_default(),
            pool: text(&spec["deviceSelector"]["pool"]),
            device: text(&spec["deviceSelector"]["device"]),
            effect: text(&spec["taint"]["effect"]),
            value: text(&spec["taint"]["value"]),
            annotations: object.metadata.annotations.clone().unwrap_or_default(),
            owner_uid: object
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "Node" && o.api_version == "v1")
                .map(|o| o.uid.clone()),
            instance: object
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(INSTANCE_LABEL))
                .cloned(),
        }
    }
}

/// The DRA calls for this node, in one `resource.k8s.io` version.
#[derive(Clone)]
pub struct DraApi {
    client: Client,
    node: String,
    timeout: Duration,
}

impl DraApi {
    /// For node `node`.
    pub fn new(client: Client, node: &str, timeout: Duration) -> Self {
        Self {
            client,
            node: node.to_string(),
            timeout,
        }
    }

    /// The node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The first of [`VERSIONS`] whose discovery document lists `devicetaintrules`
    /// (`Ok(None)`: none does: too old a cluster, or the `DRADeviceTaintRules` gate off).
    pub async fn discover(&self) -> Result<Option<&'static str>, ApiError> {
        for version in VERSIONS {
            let group_version = format!("{GROUP}/{version}");
            let listed = timed(
                self.timeout,
                "GET",
                format!("apis/{group_version}"),
                self.client.list_api_group_resources(&group_version),
            )
            .await;
            match listed {
                Ok(list) => {
                    if list.resources.iter().any(|r| r.name == "devicetaintrules") {
                        return Ok(Some(version));
                    }
                }
                // A version the server does not serve.
                Err(e) if e.code() == Some(404) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    fn api(&self, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(GROUP, version, kind);
        Api::all_with(
            self.client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    }

    fn rules(&self, version: &str) -> Api<DynamicObject> {
        self.api(version, "DeviceTaintRule", "devicetaintrules")
    }

    /// The devices the NVIDIA DRA driver publishes for this node (its ResourceSlices with
    /// pool = this node); empty: the driver does not run here (a device-plugin node).
    pub async fn gpu_devices(&self, version: &str) -> Result<Vec<SliceDevice>, ApiError> {
        let slices = self.api(version, "ResourceSlice", "resourceslices");
        let params = ListParams::default()
            .fields(&format!("spec.nodeName={},spec.driver={DRIVER}", self.node));
        let list = timed(
            self.timeout,
            "LIST",
            format!("{GROUP}/{version}/resourceslices"),
            slices.list(&params),
        )
        .await?;
        Ok(list
            .items
            .iter()
            .filter(|s| {
                s.data["spec"]["driver"] == DRIVER && s.data["spec"]["pool"]["name"] == self.node
            })
            .flat_map(|s| {
                s.data["spec"]["devices"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|d| {
                // An attribute is named bare (the driver's domain implied) or qualified.
                let attribute = |name: &str| {
                    let attributes = &d["attributes"];
                    [
                        &attributes[name],
                        &attributes[format!("{DRIVER}/{name}").as_str()],
                    ]
                    .into_iter()
                    .find_map(|a| a["string"].as_str().map(str::to_string))
                };
                SliceDevice {
                    name: d["name"].as_str().unwrap_or_default().to_string(),
                    uuid: attribute("uuid"),
                    parent_uuid: attribute("parentUUID"),
                }
            })
            .filter(|d| !d.name.is_empty())
            .collect())
    }

    /// This node's Node object: its uid and instance id, what its rules are owned by.
    pub async fn owner(&self) -> Result<NodeOwner, ApiError> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = timed(
            self.timeout,
            "GET",
            format!("nodes/{}", self.node),
            nodes.get(&self.node),
        )
        .await?;
        let instance = node
            .spec
            .and_then(|s| s.provider_id)
            .and_then(|p| instance_of(&p));
        Ok(NodeOwner {
            name: self.node.clone(),
            uid: node.metadata.uid.unwrap_or_default(),
            instance,
        })
    }

    /// This agent's rules for this node (label `app.kubernetes.io/managed-by=gpu-agent`,
    /// selector pool = this node).
    pub async fn my_rules(&self, version: &str) -> Result<Vec<StoredRule>, ApiError> {
        let params = ListParams::default().labels(MANAGED_BY);
        let list = timed(
            self.timeout,
            "LIST",
            format!("{GROUP}/{version}/devicetaintrules"),
            self.rules(version).list(&params),
        )
        .await?;
        Ok(list
            .items
            .iter()
            .map(StoredRule::of)
            .filter(|r| r.pool == self.node)
            .collect())
    }

    /// Create `rule` (a full object).
    pub async fn create(&self, version: &str, rule: &serde_json::Value) -> Result<(), ApiError> {
        let name = rule["metadata"]["name"].as_str().unwrap_or_default();
        let resource = format!("{GROUP}/{version}/devicetaintrules/{name}");
        let object: DynamicObject =
            serde_json::from_value(rule.clone()).map_err(|e| ApiError::Status {
                verb: "POST",
                resource: resource.clone(),
                code: 0,
                reason: "Encode".into(),
                message: e.to_string(),
            })?;
        timed(
            self.timeout,
            "POST",
            resource,
            self.rules(version).create(&PostParams::default(), &object),
        )
        .await
        .map(|_| ())
    }

    /// GET rule `name`.
    pub async fn get(&self, version: &str, name: &str) -> Result<StoredRule, ApiError> {
        timed(
            self.timeout,
            "GET",
            format!("{GROUP}/{version}/devicetaintrules/{name}"),
            self.rules(version).get(name),
        )
        .await
        .map(|o| StoredRule::of(&o))
    }

    /// JSON merge PATCH of rule `name`.
    pub async fn patch(
        &self,
        version: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(), ApiError> {
        timed(
            self.timeout,
            "PATCH",
            format!("{GROUP}/{version}/devicetaintrules/{name}"),
            self.rules(version)
                .patch(name, &PatchParams::default(), &Patch::Merge(body)),
        )
        .await
        .map(|_| ())
    }

    /// DELETE rule `name`; one already gone is not an error.
    pub async fn delete(&self, version: &str, name: &str) -> Result<(), ApiError> {
        match timed(
            self.timeout,
            "DELETE",
            format!("{GROUP}/{version}/devicetaintrules/{name}"),
            self.rules(version).delete(name, &DeleteParams::default()),
        )
        .await
        {
            Err(e) if e.code() == Some(404) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

/// The instance id in a Node's `spec.providerID` (`aws:///us-west-2a/i-0abc`: the last
/// segment, where it is an instance id).
pub fn instance_of(provider_id: &str) -> Option<String> {
    provider_id
        .rsplit('/')
        .next()
        .filter(|id| id.starts_with("i-") && id.len() > 2)
        .map(str::to_string)
}

/// The label every rule this agent writes carries.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by=gpu-agent";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_id_is_the_last_segment_of_an_aws_provider_id() {
        assert_eq!(
            instance_of("aws:///us-west-2a/i-0123456789abcdef0").as_deref(),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(instance_of("kind://docker/kind/kind-worker"), None);
        assert_eq!(instance_of(""), None);
    }
}
