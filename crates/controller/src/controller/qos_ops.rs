//! The operator's limits on a running controller ([`crate::qos`]): set at
//! start from the configuration and changed by the control socket.

use std::sync::Arc;

use super::Controller;
use crate::qos::{QosError, QosGroup, QosLimits, QosReport, QosTarget};

impl Controller {
    /// Replaces `target`'s own limits (empty: none). The commands held
    /// back are charged again under the new limits at once.
    pub fn qos_set(&self, target: QosTarget, limits: QosLimits) -> Result<(), QosError> {
        self.check_target(target)?;
        self.shared.qos.set(target, limits)?;
        self.wake_workers();
        Ok(())
    }

    /// `target` shares `group`'s budget from now on (`None`: leaves its
    /// group).
    pub fn qos_join(
        &self,
        target: QosTarget,
        group: Option<Arc<QosGroup>>,
    ) -> Result<(), QosError> {
        self.check_target(target)?;
        self.shared.qos.join(target, group);
        self.wake_workers();
        Ok(())
    }

    /// New limits for group `name`, which a target of this controller is in
    /// (every member, in any controller, shares them).
    pub fn qos_set_group(&self, name: &str, limits: QosLimits) -> Result<(), QosError> {
        let group = self
            .shared
            .qos
            .group(name)
            .ok_or_else(|| QosError::NoGroup(name.to_string()))?;
        group.set(limits)?;
        self.wake_workers();
        Ok(())
    }

    /// Group `name`, if a target of this controller is in it.
    pub fn qos_group(&self, name: &str) -> Option<Arc<QosGroup>> {
        self.shared.qos.group(name)
    }

    /// The limits, groups and their counters.
    pub fn qos_get(&self) -> QosReport {
        self.shared.qos.report()
    }

    fn check_target(&self, target: QosTarget) -> Result<(), QosError> {
        match target {
            QosTarget::Namespace(nsid) if self.shared.subsystem.namespaces.get(nsid).is_none() => {
                Err(QosError::NoNamespace(nsid))
            }
            _ => Ok(()),
        }
    }

    /// Every worker looks at its held commands again (they may start
    /// earlier now).
    fn wake_workers(&self) {
        for m in &self.shared.queues.mailboxes {
            m.wake_for_completions();
        }
    }
}
