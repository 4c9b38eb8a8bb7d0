//! One module per subcommand.
pub mod types;
