//! Custom resources: what a `CustomResourceDefinition` says the simulator should serve.
//!
//! Objects of a custom resource are stored and served like the built-in ones (list, watch,
//! selectors, patches, server-side apply), with no schema: the simulator keeps whatever a
//! client writes, and with a status subresource the main resource ignores `status` as
//! kube-apiserver does. One version is served, the definition's storage version.

use std::path::Path;

use serde_json::Value;

/// A custom resource the simulator serves. Made once at start and kept for the process's
/// life (leaked), so that [`crate::Resource`] stays `Copy`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CustomResource {
    /// `spec.group`.
    pub group: &'static str,
    /// The served version's name.
    pub version: &'static str,
    /// `group/version`.
    pub api_version: &'static str,
    /// `spec.names.plural`.
    pub plural: &'static str,
    /// `spec.names.singular` (the lowercased kind when unset).
    pub singular: &'static str,
    /// `spec.names.kind`.
    pub kind: &'static str,
    /// `spec.names.listKind` (kind + `List` when unset).
    pub list_kind: &'static str,
    /// `spec.names.shortNames`.
    pub short_names: &'static [&'static str],
    /// `spec.scope` is `Namespaced`.
    pub namespaced: bool,
    /// The served version has `subresources.status`.
    pub status: bool,
}

/// Why a definition cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    /// The file could not be read or parsed.
    #[error("reading {path}: {reason}")]
    File {
        /// The definition's file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The document is no `apiextensions.k8s.io/v1` `CustomResourceDefinition`.
    #[error(
        "not an apiextensions.k8s.io/v1 CustomResourceDefinition (apiVersion {api_version:?}, kind {kind:?})"
    )]
    NotADefinition {
        /// The document's `apiVersion`.
        api_version: String,
        /// The document's `kind`.
        kind: String,
    },
    /// A field the simulator needs is missing or has the wrong form.
    #[error("CustomResourceDefinition {name:?}: {field} {problem}")]
    Field {
        /// `metadata.name`.
        name: String,
        /// The field's path.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl CustomResource {
    /// Reads a definition from a YAML or JSON file.
    pub fn load(path: &Path) -> Result<&'static CustomResource, DefinitionError> {
        let file = |reason: String| DefinitionError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
        let value: Value = serde_saphyr::from_str(&text).map_err(|e| file(e.to_string()))?;
        CustomResource::from_definition(&value)
    }

    /// The resource a `CustomResourceDefinition` object defines.
    pub fn from_definition(definition: &Value) -> Result<&'static CustomResource, DefinitionError> {
        let text = |value: &Value| value.as_str().map(str::to_owned);
        let api_version = text(&definition["apiVersion"]).unwrap_or_default();
        let kind = text(&definition["kind"]).unwrap_or_default();
        if api_version != "apiextensions.k8s.io/v1" || kind != "CustomResourceDefinition" {
            return Err(DefinitionError::NotADefinition { api_version, kind });
        }
        let name = text(&definition["metadata"]["name"]).unwrap_or_default();
        let missing = |field: &'static str| DefinitionError::Field {
            name: name.clone(),
            field,
            problem: "is missing",
        };
        let spec = &definition["spec"];
        let names = &spec["names"];
        let group = text(&spec["group"]).ok_or_else(|| missing("spec.group"))?;
        let plural = text(&names["plural"]).ok_or_else(|| missing("spec.names.plural"))?;
        let kind = text(&names["kind"]).ok_or_else(|| missing("spec.names.kind"))?;
        let namespaced = match spec["scope"].as_str() {
            Some("Namespaced") => true,
            Some("Cluster") => false,
            _ => {
                return Err(DefinitionError::Field {
                    name,
                    field: "spec.scope",
                    problem: "is neither Namespaced nor Cluster",
                });
            }
        };
        if name != format!("{plural}.{group}") {
            return Err(DefinitionError::Field {
                name,
                field: "metadata.name",
                problem: "must be <spec.names.plural>.<spec.group>",
            });
        }
        let versions: &[Value] = spec["versions"].as_array().map_or(&[], Vec::as_slice);
        let served = |v: &&Value| v["served"].as_bool().unwrap_or(false);
        let version = versions
            .iter()
            .filter(served)
            .find(|v| v["storage"].as_bool().unwrap_or(false))
            .or_else(|| versions.iter().find(served))
            .ok_or_else(|| DefinitionError::Field {
                name: name.clone(),
                field: "spec.versions",
                problem: "has no served version",
            })?;
        let version_name = text(&version["name"]).ok_or_else(|| missing("spec.versions[].name"))?;
        let short_names: Vec<&'static str> = names["shortNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|short| leak(short.to_owned()))
            .collect();
        let custom = CustomResource {
            api_version: leak(format!("{group}/{version_name}")),
            group: leak(group),
            version: leak(version_name),
            singular: leak(text(&names["singular"]).unwrap_or_else(|| kind.to_lowercase())),
            list_kind: leak(text(&names["listKind"]).unwrap_or_else(|| format!("{kind}List"))),
            plural: leak(plural),
            kind: leak(kind),
            short_names: Box::leak(short_names.into_boxed_slice()),
            namespaced,
            status: version["subresources"]["status"].is_object(),
        };
        Ok(Box::leak(Box::new(custom)))
    }
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{CustomResource, DefinitionError};

    fn spark(versions: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": "sparkapplications.sparkoperator.k8s.io" },
            "spec": {
                "group": "sparkoperator.k8s.io",
                "scope": "Namespaced",
                "names": { "plural": "sparkapplications", "kind": "SparkApplication", "shortNames": ["sparkapp"] },
                "versions": versions,
            }
        })
    }

    #[test]
    fn the_storage_version_is_served_with_its_status_subresource() {
        let custom = CustomResource::from_definition(&spark(json!([
            { "name": "v1beta1", "served": true, "storage": false },
            { "name": "v1beta2", "served": true, "storage": true, "subresources": { "status": {} } },
        ])))
        .unwrap();
        assert_eq!(custom.api_version, "sparkoperator.k8s.io/v1beta2");
        assert_eq!(custom.singular, "sparkapplication");
        assert_eq!(custom.list_kind, "SparkApplicationList");
        assert_eq!(custom.short_names, ["sparkapp"]);
        assert!(custom.namespaced && custom.status);
    }

    #[test]
    fn a_definition_the_simulator_cannot_serve_says_why() {
        let cases = [
            (
                json!({ "apiVersion": "v1", "kind": "Pod" }),
                "not an apiextensions.k8s.io/v1 CustomResourceDefinition",
            ),
            (
                spark(json!([{ "name": "v1", "served": false, "storage": true }])),
                "spec.versions has no served version",
            ),
            (spark(json!([])), "spec.versions has no served version"),
        ];
        for (definition, expected) in cases {
            let error = CustomResource::from_definition(&definition).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
        let mut misnamed = spark(json!([{ "name": "v1", "served": true, "storage": true }]));
        misnamed["metadata"]["name"] = json!("sparks");
        assert!(matches!(
            CustomResource::from_definition(&misnamed),
            Err(DefinitionError::Field {
                field: "metadata.name",
                ..
            })
        ));
    }
}
