//! The resources the simulator serves, and what discovery says about them.

/// A resource type served by the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// core/v1 `namespaces` (cluster-scoped).
    Namespaces,
    /// core/v1 `pods`.
    Pods,
    /// coordination.k8s.io/v1 `leases`, used for leader election.
    Leases,
}

impl Resource {
    /// Every served resource, in discovery order.
    pub const ALL: [Resource; 3] = [Resource::Namespaces, Resource::Pods, Resource::Leases];

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Namespaces | Resource::Pods => "",
            Resource::Leases => "coordination.k8s.io",
        }
    }

    /// `apiVersion` of objects of this resource.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Namespaces | Resource::Pods => "v1",
            Resource::Leases => "coordination.k8s.io/v1",
        }
    }

    /// The URL plural.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Namespaces => "namespaces",
            Resource::Pods => "pods",
            Resource::Leases => "leases",
        }
    }

    /// The object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Namespaces => "Namespace",
            Resource::Pods => "Pod",
            Resource::Leases => "Lease",
        }
    }

    /// The list kind.
    pub fn list_kind(self) -> &'static str {
        match self {
            Resource::Namespaces => "NamespaceList",
            Resource::Pods => "PodList",
            Resource::Leases => "LeaseList",
        }
    }

    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Resource::Namespaces)
    }

    /// Short names kubectl accepts (`po`, `ns`).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Namespaces => &["ns"],
            Resource::Pods => &["po"],
            Resource::Leases => &[],
        }
    }

    /// The subresources served, beside the main resource.
    pub fn subresources(self) -> &'static [&'static str] {
        match self {
            Resource::Namespaces | Resource::Pods => &["status"],
            Resource::Leases => &[],
        }
    }

    /// Subresources served for reading only (`pods/log`, once a kubelet writes logs).
    pub fn read_only_subresources(self) -> &'static [&'static str] {
        match self {
            Resource::Pods => &["log"],
            Resource::Namespaces | Resource::Leases => &[],
        }
    }

    /// Whether `sub` is served at all, read-only or not.
    pub fn serves_subresource(self, sub: &str) -> bool {
        self.subresources().contains(&sub) || self.read_only_subresources().contains(&sub)
    }

    /// Whether the main resource ignores status changes (they go through `/status`).
    pub fn has_status_subresource(self) -> bool {
        !self.subresources().is_empty()
    }

    /// Field selector labels the real server supports for this resource, beyond metadata.
    pub fn selectable_fields(self) -> &'static [&'static str] {
        match self {
            Resource::Namespaces => &["metadata.name", "status.phase"],
            Resource::Pods => &[
                "metadata.name",
                "metadata.namespace",
                "status.phase",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
            ],
            Resource::Leases => &["metadata.name", "metadata.namespace"],
        }
    }

    /// The resource served at `group/version` with this plural, if any.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|resource| {
            resource.group() == group
                && resource.version() == version
                && resource.plural() == plural
        })
    }

    /// The version part of `apiVersion`.
    pub fn version(self) -> &'static str {
        "v1"
    }
}
