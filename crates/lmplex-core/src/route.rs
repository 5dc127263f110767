//! What a caller asks of the router: a `Route` (mode, tier, budgets) and its vocabulary, `Tier`
//! and `Mode`. The API's `lmplex` object, a tenant's `[tenants.route]` and Python's
//! `lmplex.Route` are this one type; `lmplex-route` chooses a model for it.
//!
//! Invariant: a `Route` that passed `validate()` has finite budgets >= 0 and names a tier when
//! its mode is `fixed`; every refusal is an `InvalidRequest` naming the value.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One of the four tiers, from cheapest and fastest to best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Low latency, lower quality.
    Fast,
    /// The default trade-off.
    Balanced,
    /// High quality.
    Deep,
    /// The best resources.
    Max,
}

impl Tier {
    /// Every tier, in order.
    pub const ALL: [Tier; 4] = [Tier::Fast, Tier::Balanced, Tier::Deep, Tier::Max];

    /// The tier's name in TOML, the API (`tier:NAME`) and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Fast => "fast",
            Tier::Balanced => "balanced",
            Tier::Deep => "deep",
            Tier::Max => "max",
        }
    }

    /// The tier named `s`, or an error naming the value and the choices.
    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| Error::invalid(format!("unknown tier '{s}': use fast, balanced, deep or max")))
    }
}

/// How a model is chosen among the candidates (rules: `select`, docs/routing.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The named tier's least-loaded model that meets the budgets.
    Fixed,
    /// The cheapest model that meets both budgets, the `balanced` tier first on equal cost.
    #[default]
    Balanced,
    /// The highest quality that meets both budgets; the cheaper on equal quality.
    Deep,
    /// The highest quality that meets the latency budget (cost only when `max_cost` is given);
    /// the faster on equal quality.
    Max,
}

impl Mode {
    /// The mode's name in the API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fixed => "fixed",
            Mode::Balanced => "balanced",
            Mode::Deep => "deep",
            Mode::Max => "max",
        }
    }

    /// The mode named `s`, or an error naming the value and the choices.
    pub fn parse(s: &str) -> Result<Self> {
        [Mode::Fixed, Mode::Balanced, Mode::Deep, Mode::Max]
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| Error::invalid(format!("unknown mode '{s}': use fixed, balanced, deep or max")))
    }
}

/// What a caller asks of the router: a mode, a tier and budgets (the API's `lmplex` object,
/// a tenant's `[tenants.route]`, Python's `lmplex.Route`). Every field is optional; `or` fills
/// the unset ones from a default (the tenant's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// How to choose; unset: `fixed` when a tier is given, else `balanced`.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Only this tier's models (required for `fixed`); unset: every tiered model.
    #[serde(default)]
    pub tier: Option<Tier>,
    /// Predicted end-to-end latency must not exceed this.
    #[serde(default)]
    pub max_latency_ms: Option<f64>,
    /// The cost bound must not exceed this.
    #[serde(default)]
    pub max_cost: Option<f64>,
}

impl Route {
    /// The mode in force: the one set, else `fixed` with a tier and `balanced` without.
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(if self.tier.is_some() { Mode::Fixed } else { Mode::Balanced })
    }

    /// This route with its unset fields taken from `default`.
    pub fn or(self, default: &Route) -> Route {
        Route {
            mode: self.mode.or(default.mode),
            tier: self.tier.or(default.tier),
            max_latency_ms: self.max_latency_ms.or(default.max_latency_ms),
            max_cost: self.max_cost.or(default.max_cost),
        }
    }

    /// Whether a budget is set.
    pub fn has_budget(&self) -> bool {
        self.max_latency_ms.is_some() || self.max_cost.is_some()
    }

    /// Checks the budgets are finite and >= 0 and `fixed` names a tier, naming the value.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("max_latency_ms", self.max_latency_ms), ("max_cost", self.max_cost)] {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    return Err(Error::invalid(format!("{name} must be a number >= 0, got {v}")));
                }
            }
        }
        if self.mode() == Mode::Fixed && self.tier.is_none() {
            return Err(Error::invalid("mode 'fixed' needs a tier"));
        }
        Ok(())
    }
}
