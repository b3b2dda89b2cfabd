"""Reading source images: decoders per format, windowing, geometry, output PNGs."""
