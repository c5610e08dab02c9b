"""The seed documents' experiment, reproduced on simulated nodes with the real scheduling code."""
