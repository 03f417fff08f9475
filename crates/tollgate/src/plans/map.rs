//! [`PlanMap`]: each plan's policy, and the default's, checked once.

use std::fmt;
use std::sync::Arc;

use http::Request;
use tollgate_core::{ConfigError, PolicyFamily};

use crate::rate_limit::Choice;

use super::source::{PlanExtension, PlanSource};

/// Each plan's policy (and perhaps its cost) on a route, and the plan of
/// each request, taken by `P` (a [`PlanSource`]): what
/// [`RateLimitLayer::plans`](crate::RateLimitLayer::plans) limits requests
/// by, in place of a hand-written
/// [`choose_policy`](crate::RateLimitLayer::choose_policy) closure.
///
/// A request without a plan, or of a plan the map does not name, is
/// limited by the map's default: a plan the auth layer knows and the map
/// does not (a new plan, a typo) falls back to it rather than failing.
///
/// The map is checked when built: a plan named twice is a
/// [`ConfigError::DuplicatePlan`], and a plan whose policy has the name of
/// the default's or of an earlier plan's a
/// [`ConfigError::SharedPlanPolicy`] (a policy's name is the identity of
/// its state: two plans would share their users' use). Its
/// [`family`](Self::family), the default's policy and every plan's, is
/// what an operator's block, reset and status of a user on the route act
/// on, whichever plan the user is on. Cloning is cheap.
///
/// ```
/// use tollgate::{Algorithm, Choice, ConfigError, PlanMap, Policy};
///
/// #[derive(Clone)]
/// struct Plan(&'static str);
///
/// impl AsRef<str> for Plan {
///     fn as_ref(&self) -> &str {
///         self.0
///     }
/// }
///
/// let free = Policy::new("export", Algorithm::TokenBucket, "50/h")?;
/// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
/// let ent = Policy::new("export-enterprise", Algorithm::TokenBucket, "2000/h")?;
/// let plans = PlanMap::builder(free)
///     .plan("pro", pro)
///     // Enterprise exports cost 1, not the route's cost.
///     .plan("enterprise", Choice::new(ent).cost(1))
///     .from_extension::<Plan>()?;
/// assert_eq!(plans.choice(Some("pro")).policy().name(), "export-pro");
/// // No plan, or a plan the map does not know: the default.
/// assert_eq!(plans.choice(None).policy().name(), "export");
/// assert_eq!(plans.choice(Some("team")).policy().name(), "export");
/// let names: Vec<&str> = plans.family().members().iter().map(|p| p.name()).collect();
/// assert_eq!(names, ["export", "export-pro", "export-enterprise"]);
///
/// // Two plans of one policy would share its state: refused.
/// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
/// let err = PlanMap::builder(Policy::new("export", Algorithm::TokenBucket, "50/h")?)
///     .plan("pro", pro.clone())
///     .plan("team", pro)
///     .from_extension::<Plan>()
///     .unwrap_err();
/// assert_eq!(
///     err,
///     ConfigError::SharedPlanPolicy { plan: "team".into(), policy: "export-pro".into() }
/// );
/// # Ok::<(), ConfigError>(())
/// ```
pub struct PlanMap<P> {
    source: Arc<P>,
    plans: Arc<Plans>,
}

/// What a map holds besides its source, checked.
struct Plans {
    default: Choice,
    plans: Box<[(Box<str>, Choice)]>,
    family: PolicyFamily,
}

impl PlanMap<()> {
    /// A map whose requests without a known plan are limited by
    /// `default` (a [`Policy`](crate::Policy), at the layer's cost, or a
    /// [`Choice`] with a cost of its own). Add plans with
    /// [`plan`](PlanMapBuilder::plan), then say where a request's plan
    /// comes from.
    pub fn builder(default: impl Into<Choice>) -> PlanMapBuilder {
        PlanMapBuilder {
            default: default.into(),
            plans: Vec::new(),
        }
    }
}

impl<P> PlanMap<P> {
    /// The choice of a request of `plan`: that plan's, or the default's
    /// for no plan or a plan the map does not name.
    pub fn choice(&self, plan: Option<&str>) -> &Choice {
        plan.and_then(|plan| self.get(plan))
            .unwrap_or(&self.plans.default)
    }

    /// The choice of `plan`, if the map names it.
    pub fn get(&self, plan: &str) -> Option<&Choice> {
        let plans = self.plans.plans.iter();
        plans
            .filter(|(name, _)| **name == *plan)
            .map(|(_, c)| c)
            .next()
    }

    /// The choice of requests without a known plan.
    pub fn default_choice(&self) -> &Choice {
        &self.plans.default
    }

    /// Every plan's name and choice, in the order given.
    pub fn plans(&self) -> impl Iterator<Item = (&str, &Choice)> {
        self.plans.plans.iter().map(|(name, c)| (&**name, c))
    }

    /// The default's policy and every plan's, named after the default's:
    /// block, reset and look at a user on the route whichever plan they
    /// are on (see [`PolicyFamily`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Key, MemoryStore, PlanMap, Policy, Store};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = Policy::new("export", Algorithm::TokenBucket, "50/h")?;
    /// let pro = Policy::new("export-pro", Algorithm::TokenBucket, "200/h")?;
    /// let plans = PlanMap::builder(free).plan("pro", pro.clone()).plan_from(
    ///     |req: &http::Request<()>| req.headers().get("x-plan")?.to_str().ok().map(str::to_owned),
    /// )?;
    /// let store = MemoryStore::new();
    /// let bob = Key::user("bob");
    /// plans.family().block(&store, &bob, Duration::from_secs(60)).await?;
    /// // Blocked on the pro plan too.
    /// assert!(!store.check(&bob, &pro, 1).await?.is_allowed());
    /// plans.family().reset(&store, &bob).await?;
    /// assert_eq!(store.status(&bob, &pro).await?.remaining(), 200);
    /// # Ok(())
    /// # }
    /// ```
    pub fn family(&self) -> &PolicyFamily {
        &self.plans.family
    }

    /// Where the map takes each request's plan from.
    pub fn source(&self) -> &P {
        &self.source
    }

    /// The choice of `request`, by its plan.
    pub fn choose<B>(&self, request: &Request<B>) -> &Choice
    where
        P: PlanSource<B>,
    {
        match self.source.plan(request) {
            Some(plan) => self.choice(Some(plan.as_ref())),
            None => self.default_choice(),
        }
    }
}

impl<P> Clone for PlanMap<P> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
            plans: self.plans.clone(),
        }
    }
}

impl<P> fmt::Debug for PlanMap<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plans: Vec<(&str, &str)> = self.plans().map(|(n, c)| (n, c.policy().name())).collect();
        f.debug_struct("PlanMap")
            .field("default", &self.default_choice().policy().name())
            .field("plans", &plans)
            .finish_non_exhaustive()
    }
}

/// A [`PlanMap`] being built: its default and plans so far. Made by
/// [`PlanMap::builder`]; [`from_extension`](Self::from_extension) or
/// [`plan_from`](Self::plan_from) checks it and makes the map.
#[derive(Debug, Clone)]
#[must_use]
pub struct PlanMapBuilder {
    default: Choice,
    plans: Vec<(String, Choice)>,
}

impl PlanMapBuilder {
    /// Requests of the plan `name` are limited by `choice` (a
    /// [`Policy`](crate::Policy) at the layer's cost, or a [`Choice`]).
    pub fn plan(mut self, name: impl Into<String>, choice: impl Into<Choice>) -> Self {
        self.plans.push((name.into(), choice.into()));
        self
    }

    /// The map, taking each request's plan from the extension of type `T`
    /// (see [`PlanExtension`]).
    ///
    /// # Errors
    ///
    /// As [`plan_from`](Self::plan_from).
    pub fn from_extension<T>(self) -> Result<PlanMap<PlanExtension<T>>, ConfigError>
    where
        T: AsRef<str> + Send + Sync + 'static,
    {
        self.plan_from(PlanExtension::new())
    }

    /// The map, taking each request's plan from `source`: a closure
    /// returning the plan's name, or any [`PlanSource`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::DuplicatePlan`] for a plan named twice, and
    /// [`ConfigError::SharedPlanPolicy`] for a plan whose policy has the
    /// name of the default's or of an earlier plan's.
    pub fn plan_from<P>(self, source: P) -> Result<PlanMap<P>, ConfigError> {
        let Self { default, plans } = self;
        for (i, (name, choice)) in plans.iter().enumerate() {
            let earlier = &plans[..i];
            if earlier.iter().any(|(n, _)| n == name) {
                return Err(ConfigError::DuplicatePlan { plan: name.clone() });
            }
            let policy = choice.policy().name();
            let taken = std::iter::once(&default)
                .chain(earlier.iter().map(|(_, c)| c))
                .any(|c| c.policy().name() == policy);
            if taken {
                return Err(ConfigError::SharedPlanPolicy {
                    plan: name.clone(),
                    policy: policy.to_owned(),
                });
            }
        }
        let members = std::iter::once(default.policy().clone())
            .chain(plans.iter().map(|(_, c)| c.policy().clone()));
        let family = PolicyFamily::new(default.policy().name(), members)?;
        let plans = plans
            .into_iter()
            .map(|(name, choice)| (name.into_boxed_str(), choice))
            .collect();
        Ok(PlanMap {
            source: Arc::new(source),
            plans: Arc::new(Plans {
                default,
                plans,
                family,
            }),
        })
    }
}
