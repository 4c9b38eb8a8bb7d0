//! One module per subcommand.
pub mod fetch_model;
pub mod generate;
pub mod inspect;
pub mod tensor;
pub mod tokenize;
pub mod types;
pub mod import;
pub mod cas;
