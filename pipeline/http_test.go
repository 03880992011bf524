package pipeline_test

import (
	"net/http"
	"net/http/httptest"
)

type recorder struct {
	*httptest.ResponseRecorder
	code int
}

func newRecorder() *recorder { return &recorder{ResponseRecorder: httptest.NewRecorder(), code: 200} }

func (r *recorder) WriteHeader(c int) { r.code = c; r.ResponseRecorder.WriteHeader(c) }

func mustRequest(path string) *http.Request { return httptest.NewRequest(http.MethodGet, path, nil) }
