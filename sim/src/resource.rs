//! The resources the simulator serves, and what discovery says about them.

use std::sync::Arc;

pub use crate::custom::CustomResource;

/// A resource type served by the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// core/v1 `namespaces` (cluster-scoped).
    Namespaces,
    /// core/v1 `pods`.
    Pods,
    /// coordination.k8s.io/v1 `leases`, used for leader election.
    Leases,
    /// A custom resource, from a CustomResourceDefinition the simulator was given.
    Custom(&'static CustomResource),
}

impl Resource {
    /// The built-in resources, in discovery order.
    pub const BUILT_IN: [Resource; 3] = [Resource::Namespaces, Resource::Pods, Resource::Leases];

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Namespaces | Resource::Pods => "",
            Resource::Leases => "coordination.k8s.io",
            Resource::Custom(custom) => custom.group,
        }
    }

    /// `apiVersion` of objects of this resource.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Namespaces | Resource::Pods => "v1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::Custom(custom) => custom.api_version,
        }
    }

    /// The URL plural.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Namespaces => "namespaces",
            Resource::Pods => "pods",
            Resource::Leases => "leases",
            Resource::Custom(custom) => custom.plural,
        }
    }

    /// The object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Namespaces => "Namespace",
            Resource::Pods => "Pod",
            Resource::Leases => "Lease",
            Resource::Custom(custom) => custom.kind,
        }
    }

    /// The list kind.
    pub fn list_kind(self) -> &'static str {
        match self {
            Resource::Namespaces => "NamespaceList",
            Resource::Pods => "PodList",
            Resource::Leases => "LeaseList",
            Resource::Custom(custom) => custom.list_kind,
        }
    }

    /// The singular name discovery reports.
    pub fn singular(self) -> &'static str {
        match self {
            Resource::Namespaces => "namespace",
            Resource::Pods => "pod",
            Resource::Leases => "lease",
            Resource::Custom(custom) => custom.singular,
        }
    }

    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        match self {
            Resource::Namespaces => false,
            Resource::Pods | Resource::Leases => true,
            Resource::Custom(custom) => custom.namespaced,
        }
    }

    /// Short names kubectl accepts (`po`, `ns`).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Namespaces => &["ns"],
            Resource::Pods => &["po"],
            Resource::Leases => &[],
            Resource::Custom(custom) => custom.short_names,
        }
    }

    /// The subresources served, beside the main resource.
    pub fn subresources(self) -> &'static [&'static str] {
        match self {
            Resource::Namespaces | Resource::Pods => &["status"],
            Resource::Leases => &[],
            Resource::Custom(custom) if custom.status => &["status"],
            Resource::Custom(_) => &[],
        }
    }

    /// Subresources served for reading only (`pods/log`, once a kubelet writes logs).
    pub fn read_only_subresources(self) -> &'static [&'static str] {
        match self {
            Resource::Pods => &["log"],
            Resource::Namespaces | Resource::Leases | Resource::Custom(_) => &[],
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
            Resource::Custom(custom) if custom.namespaced => {
                &["metadata.name", "metadata.namespace"]
            }
            Resource::Custom(_) => &["metadata.name"],
        }
    }

    /// The version part of `apiVersion`.
    pub fn version(self) -> &'static str {
        match self {
            Resource::Custom(custom) => custom.version,
            _ => "v1",
        }
    }
}

/// The resources one simulator serves: the built-in ones, then the custom ones it was given.
#[derive(Debug, Clone)]
pub struct Served(Arc<[Resource]>);

impl Served {
    /// The built-in resources and `custom`.
    pub fn new(custom: &[&'static CustomResource]) -> Served {
        let all: Vec<Resource> = Resource::BUILT_IN
            .into_iter()
            .chain(custom.iter().map(|c| Resource::Custom(c)))
            .collect();
        Served(all.into())
    }

    /// Every served resource, in discovery order.
    pub fn all(&self) -> impl Iterator<Item = Resource> + '_ {
        self.0.iter().copied()
    }

    /// The resource served at `group/version` with this plural, if any.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Resource> {
        self.all().find(|resource| {
            resource.group() == group
                && resource.version() == version
                && resource.plural() == plural
        })
    }
}

impl Default for Served {
    fn default() -> Served {
        Served::new(&[])
    }
}
