//! One module per subcommand.
pub mod ablate;
pub mod cas;
pub mod fetch_model;
pub mod generate;
pub mod import;
pub mod importance;
pub mod inspect;
pub mod load;
pub mod models;
pub mod perplexity;
pub mod profile;
pub mod refine;
pub mod serve;
pub mod tensor;
pub mod tokenize;
pub mod types;
pub mod worker;
