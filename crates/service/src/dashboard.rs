//! The dashboard (placeholder while the API is built).
use crate::state::AppState;
use axum::Router;
pub(crate) fn routes(_state: AppState) -> Router<AppState> {
    Router::new()
}
