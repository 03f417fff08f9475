//! [`ExtensionKey`]: the identity an auth layer put into the request's
//! extensions, made a key by [`ToKey`].

use std::fmt;
use std::marker::PhantomData;

use http::Request;
use tollgate_core::{Key, KeyKind, TypeTag};

use super::{KeyExtractor, MissingCause};

/// A value that identifies a user or client, put into request extensions by
/// an authentication layer and read by [`ExtensionKey`].
///
/// The implementations for strings and integers make
/// [`KeyKind::User`](tollgate_core::KeyKind::User) keys tagged with the
/// value's type ([`Key::typed`]), so that a string and a number with the
/// same bytes, or `-1i64` and `u64::MAX`, are different users.
///
/// ```
/// use tollgate::{Key, KeyKind, ToKey, TypeTag};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl ToKey for UserId {
///     fn to_key(&self) -> Key {
///         self.0.to_key()
///     }
/// }
/// assert_eq!(UserId(7).to_key(), Key::typed(KeyKind::User, TypeTag::Unsigned, 7u64.to_be_bytes()));
/// assert_ne!(0x61646d696e5f5f5f_u64.to_key(), "admin___".to_key());
/// assert_ne!((-1_i64).to_key(), u64::MAX.to_key());
/// ```
pub trait ToKey {
    /// The [`Key`] (normally of [`KeyKind::User`](tollgate_core::KeyKind::User)).
    fn to_key(&self) -> Key;
}

impl ToKey for String {
    fn to_key(&self) -> Key {
        self.as_str().to_key()
    }
}

impl ToKey for str {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Str, self)
    }
}

impl ToKey for u64 {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Unsigned, self.to_be_bytes())
    }
}

impl ToKey for u32 {
    fn to_key(&self) -> Key {
        u64::from(*self).to_key()
    }
}

impl ToKey for i64 {
    fn to_key(&self) -> Key {
        Key::typed(KeyKind::User, TypeTag::Signed, self.to_be_bytes())
    }
}

impl ToKey for i32 {
    fn to_key(&self) -> Key {
        i64::from(*self).to_key()
    }
}

impl ToKey for Key {
    fn to_key(&self) -> Key {
        self.clone()
    }
}

/// The authenticated identity of type `T` that an auth layer put into the
/// request's extensions. Requests without it (unauthenticated) yield no
/// key; this extractor never reads anything the client sent.
///
/// ```
/// use http::Request;
/// use tollgate::{ExtensionKey, Key, KeyExtractor, ToKey};
///
/// let by_user = ExtensionKey::<String>::new();
/// let mut req = Request::new(());
/// assert_eq!(by_user.extract(&req), None);
/// req.extensions_mut().insert("ada".to_string());
/// assert_eq!(by_user.extract(&req), Some("ada".to_key()));
/// ```
pub struct ExtensionKey<T> {
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys requests by their `T` extension.
    pub fn new() -> Self {
        Self {
            _marker: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: ToKey + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        request.extensions().get::<T>().map(ToKey::to_key)
    }

    /// No identity from the auth layer: [`MissingCause::Unauthenticated`].
    fn missing(&self, _: &Request<B>) -> MissingCause {
        MissingCause::Unauthenticated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_key_of_different_types_never_collides() {
        // The same eight bytes as a number and as text.
        assert_ne!(0x6164_6d69_6e5f_5f5f_u64.to_key(), "admin___".to_key());
        assert_ne!((-1_i64).to_key(), u64::MAX.to_key());
        assert_ne!(5_i64.to_key(), 5_u64.to_key());
        // One type, one key, whatever the width or ownership.
        assert_eq!(7_u32.to_key(), 7_u64.to_key());
        assert_eq!((-7_i32).to_key(), (-7_i64).to_key());
        assert_eq!(String::from("ada").to_key(), "ada".to_key());
    }
}
