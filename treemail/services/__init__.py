"""Services: load, decide with the command table, append with the expected etag, retry on conflict."""
