//! Redis persistence with EventMQ's key layout (spec §7.7). Placeholder.
use super::key::ScheduleKey;
use super::store::{Store, StoreError, Stored};

/// Redis store.
pub struct RedisStore;
impl RedisStore {
    /// Connects.
    ///
    /// # Errors
    /// Always for now.
    pub fn connect(_url: &str) -> Result<RedisStore, StoreError> {
        Err(StoreError::Redis("not implemented".into()))
    }
}
impl Store for RedisStore {
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError> {
        Ok(Vec::new())
    }
    fn put(&mut self, _key: &ScheduleKey, _stored: &Stored) -> Result<(), StoreError> {
        Ok(())
    }
    fn delete(&mut self, _key: &ScheduleKey) -> Result<(), StoreError> {
        Ok(())
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}
