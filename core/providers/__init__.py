"""Model providers behind one interface (see ``base``)."""
