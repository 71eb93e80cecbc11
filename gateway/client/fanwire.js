// fanwire.js: placeholder, replaced by the client.
