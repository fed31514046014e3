//! The core's state on disk: the kernel-log cursor and the faults, in one file, so the two
//! can never disagree after a crash (a record is either merged and behind the cursor, or
//! neither).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;
use crate::model::Fault;

const FORMAT_VERSION: u32 = 1;

/// What survives an agent restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedState {
    /// File format version.
    pub version: u32,
    /// The boot the cursor belongs to.
    pub boot_id: String,
    /// Sequence number of the last kernel-log record merged.
    pub kmsg_cursor: Option<u64>,
    /// Faults in the model.
    pub faults: Vec<Fault>,
    /// Boots in which each fatal reset/reboot fault was seen (for escalation to replace).
    #[serde(default)]
    pub recurrence: std::collections::BTreeMap<String, Vec<BootSighting>>,
    /// The GPU (UUID, else serial) NVML last saw in each slot (`0000:18:00`): a fault's
    /// history belongs to the GPU, and goes when another GPU sits in its slot.
    #[serde(default)]
    pub gpus: std::collections::BTreeMap<String, String>,
}

/// A boot in which a fault was seen, and when it was first seen in that boot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "SightingOnDisk")]
pub struct BootSighting {
    /// The boot id.
    pub boot_id: String,
    /// When the fault was first seen in that boot.
    pub at: std::time::SystemTime,
}

/// Earlier versions kept only the boot id: such a sighting has no time and counts as old
/// (outside every escalation window), so it can never condemn a node on its own.
#[derive(Deserialize)]
#[serde(untagged)]
enum SightingOnDisk {
    Timed {
        boot_id: String,
        at: std::time::SystemTime,
    },
    BootOnly(String),
}

impl From<SightingOnDisk> for BootSighting {
    fn from(on_disk: SightingOnDisk) -> Self {
        match on_disk {
            SightingOnDisk::Timed { boot_id, at } => Self { boot_id, at },
            SightingOnDisk::BootOnly(boot_id) => Self {
                boot_id,
                at: std::time::SystemTime::UNIX_EPOCH,
            },
        }
    }
}

impl PersistedState {
    /// A state for `boot_id` with nothing in it.
    pub fn empty(boot_id: &str) -> Self {
        Self {
            version: FORMAT_VERSION,
            boot_id: boot_id.to_string(),
            kmsg_cursor: None,
            faults: Vec::new(),
            recurrence: std::collections::BTreeMap::new(),
            gpus: std::collections::BTreeMap::new(),
        }
    }
}

/// Why the state could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The state directory could not be created.
    #[error("cannot create state directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] fsutil::WriteError),
    /// Serialising failed.
    #[error("cannot encode state: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Loads and saves [`PersistedState`] in `<state_dir>/state.json`.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    /// A store under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join("state.json"),
        }
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Load the state: the file, else its backup (a corrupt file is logged and moved aside),
    /// else `None`.
    pub fn load(&self) -> Option<PersistedState> {
        fsutil::read_json_or_backup(&self.path, "state", |state: &PersistedState| {
            (state.version == FORMAT_VERSION)
                .then_some(())
                .ok_or_else(|| format!("unknown format version {}", state.version))
        })
    }

    /// Save the state atomically (with a backup of the previous one).
    pub fn save(&self, state: &PersistedState) -> Result<(), PersistError> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| PersistError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let bytes = serde_json::to_vec_pretty(state)?;
        fsutil::write_atomic(&self.path, &bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_falls_back_to_backup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::new(&dir.path().join("nested"));
        assert_eq!(store.load(), None);
        let mut state = PersistedState::empty("boot-a");
        state.kmsg_cursor = Some(41);
        store.save(&state).expect("save");
        state.kmsg_cursor = Some(42);
        store.save(&state).expect("save again");
        assert_eq!(store.load().expect("load").kmsg_cursor, Some(42));
        std::fs::write(store.path(), b"{ half a file").expect("corrupt it");
        assert_eq!(store.load().expect("backup").kmsg_cursor, Some(41));
        assert!(store.path().with_extension("corrupt").exists());
    }

    #[test]
    fn an_old_boot_only_sighting_loads_as_old() {
        let old = r#"{"version":1,"boot_id":"b","kmsg_cursor":null,"faults":[],
            "recurrence":{"k":["boot-1",{"boot_id":"boot-2","at":{"secs_since_epoch":5,"nanos_since_epoch":0}}]}}"#;
        let state: PersistedState = serde_json::from_str(old).expect("old format loads");
        let seen = &state.recurrence["k"];
        assert_eq!(seen[0].boot_id, "boot-1");
        assert_eq!(seen[0].at, std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(
            seen[1].at,
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5)
        );
    }
}
