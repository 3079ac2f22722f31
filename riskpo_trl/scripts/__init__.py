"""Entry points (``riskpo-train``): thin layers over the library that nothing inside ``riskpo_trl`` imports."""
