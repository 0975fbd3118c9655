# Managed by Halos (halod). Gemini CLI reaches the Halos gateway with a short-lived
# token minted here at shell start; the token itself is never written to disk.
GOOGLE_GEMINI_BASE_URL='https://halo-gateway.acme.com'
export GOOGLE_GEMINI_BASE_URL
GEMINI_API_KEY="$(sh -c 'halo auth token --audience api://halos')"
export GEMINI_API_KEY
