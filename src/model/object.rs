//! JSON bodies that must be objects (request bodies of the API). serde's derived `Deserialize` of a struct also takes an
//! array of its fields in order (so `[]` is a struct whose fields all have defaults, and
//! `["img", {…}]` a session request); the API takes objects only, as its OpenAPI document says.
//! [`Object`] wraps a request body, [`objects`] an array field of structs.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A `T` deserialized from a JSON object only (an array is "invalid type: sequence, expected a
/// JSON object").
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<T> Object<T> {
    /// The value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor(PhantomData)).map(Object)
    }
}

/// `#[serde(deserialize_with = "objects")]` for a `Vec` of structs: each element must be a
/// JSON object.
///
/// Errors: the deserializer's, for anything but an array of objects that deserialize as `T`.
pub fn objects<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Vec::<Object<T>>::deserialize(d)?
        .into_iter()
        .map(Object::into_inner)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        name: String,
        #[serde(default)]
        ro: bool,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default)]
        limit: Option<u32>,
        #[serde(default, deserialize_with = "objects")]
        items: Vec<Inner>,
    }

    fn parse(text: &str) -> Result<Outer, serde_json::Error> {
        serde_json::from_str::<Object<Outer>>(text).map(Object::into_inner)
    }

    #[test]
    fn objects_only() {
        assert_eq!(
            parse(r#"{"items": [{"name": "a", "ro": true}]}"#).unwrap(),
            Outer {
                limit: None,
                items: vec![Inner {
                    name: "a".into(),
                    ro: true
                }]
            }
        );
        assert_eq!(parse("{}").unwrap().items, vec![]);
        for bad in [
            "[]",
            "[1, []]",
            r#"{"items": [["a", true]]}"#,
            r#"{"items": [{"name": "a", "x": 1}]}"#,
            r#"{"limit": 1, "other": 2}"#,
            "null",
            "3",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
        assert!(parse("[]")
            .unwrap_err()
            .to_string()
            .contains("expected a JSON object"));
    }
}
