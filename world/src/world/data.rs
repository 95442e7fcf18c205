//! The reference data: cities and edge sites, embedded in the library and validated when read.

use anyhow::{bail, ensure, Context, Result};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// `data/cities.csv`: cities of at least 100,000 people (GeoNames, CC BY 4.0).
pub const CITIES_CSV: &str = include_str!("../../../data/cities.csv");
/// `data/pop-sites.csv`: 240 edge sites at the airports of the most populous metros.
pub const SITES_CSV: &str = include_str!("../../../data/pop-sites.csv");

/// A row of `data/cities.csv`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct City {
    pub geonameid: u64,
    pub name: String,
    /// ISO 3166-1 alpha-2 code.
    pub country: String,
    pub lat: f64,
    pub lon: f64,
    pub population: u64,
    /// IANA time zone.
    pub timezone: String,
}

/// A row of `data/pop-sites.csv`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Site {
    /// IATA code of the site's airport.
    pub iata: String,
    pub metro: String,
    pub country: String,
    pub lat: f64,
    pub lon: f64,
    pub timezone: String,
    pub metro_population: u64,
}

fn parse_csv<T: DeserializeOwned>(what: &str, text: &str) -> Result<Vec<T>> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    reader
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{what}: record {}", i + 1)))
        .collect()
}

fn check_coordinates(what: &str, lat: f64, lon: f64) -> Result<()> {
    ensure!(
        lat.is_finite() && (-90.0..=90.0).contains(&lat),
        "{what}: latitude {lat} out of range"
    );
    ensure!(
        lon.is_finite() && (-180.0..=180.0).contains(&lon),
        "{what}: longitude {lon} out of range"
    );
    Ok(())
}

/// The embedded cities, validated (coordinates in range, population > 0).
pub fn cities() -> Result<Vec<City>> {
    let cities: Vec<City> = parse_csv("data/cities.csv", CITIES_CSV)?;
    ensure!(!cities.is_empty(), "data/cities.csv: no cities");
    ensure!(
        cities.len() <= usize::from(u16::MAX),
        "data/cities.csv: more than {} cities",
        u16::MAX
    );
    for c in &cities {
        check_coordinates(&format!("data/cities.csv: {}", c.name), c.lat, c.lon)?;
        ensure!(
            c.population > 0,
            "data/cities.csv: {} has no population",
            c.name
        );
    }
    Ok(cities)
}

/// The embedded edge sites, validated (coordinates in range, distinct IATA codes), most populous
/// metro first (ties by IATA code).
pub fn sites() -> Result<Vec<Site>> {
    sites_from("data/pop-sites.csv", SITES_CSV)
}

/// Edge sites from `text` in the format of `data/pop-sites.csv` (`what` names it in errors),
/// validated and ordered as [`sites`] does.
pub fn sites_from(what: &str, text: &str) -> Result<Vec<Site>> {
    let mut sites: Vec<Site> = parse_csv(what, text)?;
    ensure!(!sites.is_empty(), "{what}: no sites");
    for s in &sites {
        check_coordinates(&format!("{what}: {}", s.iata), s.lat, s.lon)?;
        ensure!(
            !s.iata.is_empty()
                && s.iata.len() <= 16
                && s.iata.chars().all(|ch| ch.is_ascii_alphanumeric()),
            "{what}: bad IATA code {:?} (1 to 16 letters and digits)",
            s.iata
        );
    }
    sites.sort_by(|a, b| {
        b.metro_population
            .cmp(&a.metro_population)
            .then_with(|| a.iata.cmp(&b.iata))
    });
    if let Some(w) = sites
        .windows(2)
        .find(|w| w[0].iata.eq_ignore_ascii_case(&w[1].iata))
    {
        bail!("{what}: duplicate IATA code {:?}", w[0].iata);
    }
    let mut codes: Vec<String> = sites.iter().map(|s| s.iata.to_ascii_lowercase()).collect();
    codes.sort();
    if let Some(w) = codes.windows(2).find(|w| w[0] == w[1]) {
        bail!("{what}: duplicate IATA code {:?}", w[0]);
    }
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_parses() {
        let cities = cities().unwrap();
        assert_eq!(cities.len(), 6_204);
        let sites = sites().unwrap();
        assert_eq!(sites.len(), 240);
        assert!(sites
            .windows(2)
            .all(|w| w[0].metro_population >= w[1].metro_population));
    }
}
