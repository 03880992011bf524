package filesource_test

import (
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/filesource"
)

// The coordination driver finds a split source's optional capabilities by
// type assertion, so a drifted method signature would switch one off (a
// followed job that never completes, a graceful stop that stops reading at
// once) without a compile error. These assertions make it one, as
// divide.go's do for the division capabilities.
var (
	_ pipeline.PlanFinalizer = (*filesource.Source)(nil)
	_ pipeline.StopReader    = (*filesource.Source)(nil)
)
