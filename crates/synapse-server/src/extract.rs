//! The JSON body extractor: any parse failure is a 400 OpenAI error naming where the body
//! went wrong (never axum's plain-text 422), a body over the limit is a 413.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ServerError;
use crate::state::AppState;

/// A JSON request body parsed into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// Parses `bytes` as `T`, with the JSON path of the first error in the message.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ServerError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path.is_empty() || path == "." {
            format!("invalid JSON body: {inner}")
        } else {
            format!("invalid JSON body at `{path}`: {inner}")
        };
        ServerError::MalformedRequest { message }
    })?;
    de.end().map_err(|e| ServerError::MalformedRequest {
        message: format!("invalid JSON body: {e}"),
    })?;
    Ok(v)
}

impl<T> FromRequest<AppState> for JsonBody<T>
where
    T: DeserializeOwned,
{
    type Rejection = ServerError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config().body_limit;
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ServerError::PayloadTooLarge { limit }
            } else {
                ServerError::MalformedRequest {
                    message: format!("could not read the body: {r}"),
                }
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::GenerationRequest;

    #[test]
    fn malformed_bodies_are_400_with_a_path() {
        let e = parse_json::<GenerationRequest>(br#"{"max_tokens":"many"}"#).unwrap_err();
        assert!(matches!(e, ServerError::MalformedRequest { .. }));
        assert!(e.to_string().contains("max_tokens"), "{e}");
        assert!(parse_json::<GenerationRequest>(b"{").is_err());
        assert!(parse_json::<GenerationRequest>(b"[1,2]").is_err());
        assert!(parse_json::<GenerationRequest>(b"{} trailing").is_err());
        assert!(parse_json::<GenerationRequest>(b"{\"prompt\":\"\xff\xfe\"}").is_err());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let body = format!("{{\"prompt\":\"x\",\"extra\":{deep}}}");
        // Skipped without recursion (an unknown field): parsed, no stack overflow.
        assert!(parse_json::<GenerationRequest>(body.as_bytes()).is_ok());
        let deep_obj = format!("{{\"response_format\":{}}}", "[".repeat(10_000));
        assert!(parse_json::<GenerationRequest>(deep_obj.as_bytes()).is_err());
    }
}
