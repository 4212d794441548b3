// Swagger UI on this server's own description; every file comes from this
// server (the strict Content-Security-Policy of /docs allows no other).
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  presets: [SwaggerUIBundle.presets.apis],
});
