//! Where a request's plan comes from: [`PlanSource`], for closures and
//! for [`PlanExtension`].

use std::fmt;
use std::marker::PhantomData;

use http::Request;

/// Names the plan of a request, for a [`PlanMap`](crate::PlanMap): most
/// often a value your auth layer put into the request's extensions
/// ([`PlanExtension`]), or a closure `Fn(&Request<B>) -> Option<N>` where
/// `N: AsRef<str>` (a `&'static str`, a `String`, a plan type of yours).
/// `None` is a request without a plan: the map's default limits it.
///
/// A type of your own implements it in a few lines:
///
/// ```
/// use http::Request;
/// use tollgate::PlanSource;
///
/// /// The plan a gateway in front of us wrote into `x-plan`.
/// struct PlanHeader;
///
/// impl<B> PlanSource<B> for PlanHeader {
///     fn plan<'r>(&self, request: &'r Request<B>) -> Option<impl AsRef<str> + 'r> {
///         request.headers().get("x-plan")?.to_str().ok()
///     }
/// }
///
/// let request = Request::get("/").header("x-plan", "pro").body(())?;
/// assert_eq!(PlanHeader.plan(&request).map(|p| p.as_ref().to_owned()), Some("pro".into()));
/// # Ok::<(), http::Error>(())
/// ```
pub trait PlanSource<B>: Send + Sync + 'static {
    /// The name of `request`'s plan, if it has one.
    fn plan<'r>(&self, request: &'r Request<B>) -> Option<impl AsRef<str> + 'r>;
}

/// A closure names the plan: it returns a value that is its name (a
/// `&'static str`, a `String`, or a plan type of yours that is
/// `AsRef<str>`).
///
/// ```
/// use http::Request;
/// use tollgate::PlanSource;
///
/// let by_host = |req: &Request<()>| {
///     let host = req.headers().get("host")?.to_str().ok()?;
///     Some(if host.starts_with("enterprise.") { "enterprise" } else { "free" })
/// };
/// let request = Request::get("/").header("host", "enterprise.example.com").body(())?;
/// assert_eq!(by_host.plan(&request).map(|p| p.as_ref().to_owned()), Some("enterprise".into()));
/// # Ok::<(), http::Error>(())
/// ```
impl<B, F, N> PlanSource<B> for F
where
    F: Fn(&Request<B>) -> Option<N> + Send + Sync + 'static,
    N: AsRef<str> + 'static,
{
    fn plan<'r>(&self, request: &'r Request<B>) -> Option<impl AsRef<str> + 'r> {
        self(request)
    }
}

/// The plan is the value of type `T` in the request's extensions, put
/// there by your auth layer: its [`AsRef<str>`] is the plan's name. A
/// request without one has no plan. Made by
/// [`PlanMapBuilder::from_extension`](crate::PlanMapBuilder::from_extension).
///
/// ```
/// use http::Request;
/// use tollgate::{PlanExtension, PlanSource};
///
/// #[derive(Clone)]
/// struct Plan(String);
///
/// impl AsRef<str> for Plan {
///     fn as_ref(&self) -> &str {
///         &self.0
///     }
/// }
///
/// let source = PlanExtension::<Plan>::new();
/// let mut request = Request::get("/").body(())?;
/// assert!(source.plan(&request).is_none());
/// request.extensions_mut().insert(Plan("pro".into()));
/// assert_eq!(source.plan(&request).map(|p| p.as_ref().to_owned()), Some("pro".into()));
/// # Ok::<(), http::Error>(())
/// ```
pub struct PlanExtension<T> {
    plan: PhantomData<fn() -> T>,
}

impl<T> PlanExtension<T> {
    /// The plan from the extension of type `T`.
    pub fn new() -> Self {
        Self { plan: PhantomData }
    }
}

impl<T> Default for PlanExtension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for PlanExtension<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for PlanExtension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanExtension")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<B, T> PlanSource<B> for PlanExtension<T>
where
    T: AsRef<str> + Send + Sync + 'static,
{
    fn plan<'r>(&self, request: &'r Request<B>) -> Option<impl AsRef<str> + 'r> {
        request.extensions().get::<T>().map(T::as_ref)
    }
}
