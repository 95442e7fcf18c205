//! cdnmap's topology as operators describe it: the JSON instance and assignment file formats
//! (documented in `docs/formats.md`), read into the mapper's [`cdnmap_mapper::Instance`].

pub mod format;
