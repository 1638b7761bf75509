"""Who is calling: actors (JWTs) and services (tokens)."""
