// fanwire.d.ts: placeholder
