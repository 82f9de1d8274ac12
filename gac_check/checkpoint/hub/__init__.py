"""Models on the Hugging Face Hub read from their headers, every request bounded."""
