//! Closed sets the store keeps as TEXT.

/// Gives a fieldless enum `as_str` (the text stored for a variant) and `parse` (the variant
/// stored as that text; None for any other text), from one table so that the two never disagree.
macro_rules! text_enum {
    ($t:ty { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),+ }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some(Self::$v),)+ _ => None }
            }
        }
    };
}

pub(super) use text_enum;

#[cfg(test)]
mod tests {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Light {
        Red,
        Green,
    }

    text_enum!(Light { Red => "red", Green => "green" });

    #[test]
    fn each_variant_reads_back_from_its_text_and_other_text_is_none() {
        for light in [Light::Red, Light::Green] {
            assert_eq!(Light::parse(light.as_str()), Some(light));
        }
        assert_eq!(Light::parse("Red"), None, "the text is matched exactly");
    }
}
